"""The executor's speed paths change no bit: fused q|k|v and gate|up int8 GEMMs against one
QuantLinear per linear, the few-op quantizers against their textbook formulas, the K|V pair quantization and the
dequantized copy of the KV cache against the plain cache."""

import pytest
import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

from interq.quant import QuantConfig, make_executor, make_kv_cache, sync_weights
from interq.quant import primitives as P
from interq.quant.executor import group_amaxes, quantized_targets
from interq.quant.kv_cache import QuantKVLayer
from interq.quant.linear import FusedQuantLinear, FusedQuantSlice, QuantLinear
from interq.quant.testing import tiny_causal_lm


# ------------------------------------------------------------------ reference formulas (the unfused code path)
def ref_quant_act_int8_token(x, rounding="half_even", bits=8):
    qmax = 2 ** (bits - 1) - 1
    xf = x.detach().float()
    amax = xf.abs().amax(dim=-1, keepdim=True)
    inv = torch.where(amax == 0, torch.zeros_like(amax), float(qmax) / amax)  # = amax.reciprocal() * qmax
    q = P.round_int8(xf * inv, rounding).clamp(-(qmax + 1), qmax)
    return q.to(torch.int8), amax / float(qmax)


def ref_quant_kv_int8(t, qcfg):
    qmax = 2 ** (qcfg.kv_bits - 1) - 1
    tf = t.detach().float()
    s = (tf.abs().amax(dim=-1, keepdim=True) / float(qmax)).clamp(min=P.KV_MIN_SCALE)
    v = (tf * (1.0 / s)).clamp(-(qmax + 1), qmax)
    return P.round_int8(v, "half_even" if qcfg.kv_int8_store == "round" else "trunc").to(torch.int8), s


def ref_epilogue(acc32, s_a, s_w, out_dtype):
    return (s_a * (s_w * acc32.float())).to(out_dtype)


def awkward(shape, dtype, seed=0):
    """Random rows of very different magnitudes, an all-zero row, signed zeros, a subnormal row, values on
    rounding ties after scaling."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g) * torch.logspace(-3, 3, shape[0])[:, None]
    x[0] = 0.0
    x[1, ::2] = -0.0
    x[2] = torch.randn(shape[1], generator=g) * 1e-39  # fp32 subnormals (bf16 keeps them too)
    x[3, :] = torch.arange(shape[1]) - shape[1] / 2  # amax = shape[1]/2: many x * 127/amax land near .5
    return x.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("rounding,bits", [("half_even", 8), ("half_away", 8), ("half_even", 4)])
def test_quant_act_int8_token_equals_the_textbook_formula_bit_for_bit(dtype, rounding, bits):
    x = awkward((9, 254), dtype)
    q, s = P.quant_act_int8_token(x, rounding, bits)
    rq, rs = ref_quant_act_int8_token(x, rounding, bits)
    assert q.dtype == torch.int8 and s.dtype == torch.float32
    assert torch.equal(q, rq) and torch.equal(s, rs)
    assert (q[3].abs() == 2 ** (bits - 1) - 1).any() and (q[0] == 0).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("store", ["round", "trunc"])
@pytest.mark.parametrize("bits", [8, 5])
def test_quant_kv_int8_equals_the_textbook_formula_bit_for_bit(dtype, store, bits):
    qcfg = QuantConfig(kv_int8_store=store, kv_bits=bits)
    t = awkward((2 * 3 * 5, 64), dtype).reshape(2, 3, 5, 64)
    q, s = P.quant_kv(t, qcfg)
    rq, rs = ref_quant_kv_int8(t, qcfg)
    assert torch.equal(q, rq) and torch.equal(s, rs)
    assert torch.equal(P.dequant_kv(q, s, dtype), (rq.float() * rs).to(dtype))


def test_epilogue_on_the_int32_accumulator_equals_the_textbook_order():
    from interq.quant.linear import epilogue

    g = torch.Generator().manual_seed(1)
    acc = torch.randint(-2**30, 2**30, (7, 40), generator=g, dtype=torch.int32)  # above 2^24: RNE to fp32
    s_a, s_w = torch.rand(7, 1, generator=g), torch.rand(40, generator=g) * 1e-3
    for dt in (torch.float32, torch.bfloat16):
        assert torch.equal(epilogue(acc, s_a, s_w, None, dt), ref_epilogue(acc, s_a, s_w, dt))
        assert torch.equal(epilogue(acc, s_a, s_w[:1], None, dt), ref_epilogue(acc, s_a, s_w[:1], dt))


# ------------------------------------------------------------------------------------------ fused GEMMs
def _linears(k, sizes, bias, dtype=torch.float32):
    torch.manual_seed(2)
    lins = {}
    for i, n in enumerate(sizes):
        lin = nn.Linear(k, n, bias=bias).to(dtype)
        with torch.no_grad():
            lin.weight.normal_(0, 0.05 * (i + 1))  # different ranges per member
        lins[f"blk.{('q_proj', 'k_proj', 'v_proj')[i]}"] = lin
    return lins


@pytest.mark.parametrize("backend", ["int_mm", "fp32_exact"])
@pytest.mark.parametrize("bias,gran,dtype", [(False, "channel", torch.bfloat16), (True, "channel", torch.float32),
                                             (True, "tensor", torch.bfloat16), (False, "tensor", torch.float32)])
def test_fused_group_equals_its_members_quant_linears_bit_for_bit(backend, bias, gran, dtype):
    qcfg = QuantConfig(w_granularity=gran)
    lins = _linears(44, (20, 12, 13), bias, dtype)  # K and N not multiples of 8: padded paths
    amaxes = group_amaxes(lins, qcfg)
    group = FusedQuantLinear(lins, qcfg, amaxes, backend)
    singles = [QuantLinear(m, qcfg, amaxes[n], backend) for n, m in lins.items()]
    for shape in ((1, 44), (3, 5, 44), (17, 44)):
        x = torch.randn(*shape).to(dtype)
        outs = group(x)
        for out, single in zip(outs, singles):
            ref = single(x)
            assert out.shape == ref.shape and out.dtype == ref.dtype and out.is_contiguous()
            assert torch.equal(out, ref)


def test_fused_members_share_one_gemm_and_recompute_for_another_input():
    qcfg = QuantConfig()
    lins = _linears(32, (16, 8, 8), False)
    group = FusedQuantLinear(lins, qcfg, group_amaxes(lins, qcfg))
    members = [FusedQuantSlice(group, i) for i in range(3)]
    calls = []
    group.register_forward_hook(lambda *a: calls.append(1))
    x, x2 = torch.randn(4, 32), torch.randn(4, 32)
    ref = group(x)
    calls.clear()
    outs = [m(x) for m in members]  # q, k, v on the same input: one GEMM
    assert len(calls) == 1 and group._memo is None  # every member served: nothing kept
    assert all(torch.equal(o, r) for o, r in zip(outs, ref))
    a = members[0](x)
    b = members[0](x)  # the same member twice: a fresh tensor, never the same object handed out twice
    assert a is not b and torch.equal(a, b) and len(calls) == 3
    k2 = members[1](x2)  # another input: recomputed
    assert torch.equal(k2, group(x2)[1])
    y = members[0](x)
    x.mul_(2)  # changed in place between members: its version counter says so
    assert torch.equal(members[1](x), group(x)[1]) and torch.equal(y, ref[0])


def _model_with_bias():
    torch.manual_seed(4)
    cfg = LlamaConfig(vocab_size=128, hidden_size=40, intermediate_size=52, num_hidden_layers=2, num_attention_heads=5,
                      num_key_value_heads=1, head_dim=8, max_position_embeddings=128, attention_bias=True,
                      mlp_bias=True, initializer_range=0.08)
    return LlamaForCausalLM(cfg).eval()


def _decode(exe, ids, n0, **cache_kw):
    cache = make_kv_cache(exe.interq_qcfg, exe.config, **cache_kw)
    out = exe(input_ids=ids[:, :n0], cache=cache, use_cache=True)
    logits = [out.logits]
    for t in range(n0, ids.shape[1]):
        out = exe(input_ids=ids[:, t:t + 1], cache=out.cache, use_cache=True)
        logits.append(out.logits)
    return torch.cat(logits, 1), cache


W8A8KV8, W4A4KV4 = QuantConfig(), QuantConfig(w_bits=4, a_bits=4, kv_bits=4)
TENSOR_AWAY = QuantConfig(w_granularity="tensor", a_int8_rounding="half_away", kv_format="none")


@pytest.mark.parametrize("kind,dtype,qcfg", [
    ("llama", torch.bfloat16, W8A8KV8), ("qwen3", torch.bfloat16, W8A8KV8), ("qwen3_moe", torch.bfloat16, W8A8KV8),
    ("llama_bias", torch.bfloat16, W8A8KV8), ("qwen3", torch.float32, W8A8KV8), ("llama_bias", torch.float32, W4A4KV4),
    ("qwen3", torch.bfloat16, W4A4KV4), ("llama_bias", torch.bfloat16, TENSOR_AWAY),
    ("qwen3", torch.float32, TENSOR_AWAY),
], ids=lambda v: str(v).replace("torch.", "") if not isinstance(v, QuantConfig) else
    {id(W8A8KV8): "w8a8kv8", id(W4A4KV4): "w4a4kv4", id(TENSOR_AWAY): "tensor_away_bf16kv"}[id(v)])
def test_fused_executor_equals_per_linear_executor_bit_for_bit(kind, dtype, qcfg):
    """Prefill and token-by-token decode against the quantized cache: the fused executor's logits are those of
    one QuantLinear per linear (``fuse=False``), bit for bit; so are the tokens a sampler would draw."""
    learner = (_model_with_bias() if kind == "llama_bias" else tiny_causal_lm(kind)).to(dtype)
    fused, plain = make_executor(learner, qcfg), make_executor(learner, qcfg, fuse=False)
    assert any(isinstance(m, FusedQuantLinear) for m in fused.modules())
    assert not any(isinstance(m, (FusedQuantLinear, FusedQuantSlice)) for m in plain.modules())
    ids = torch.randint(0, 128, (3, 11))
    with torch.no_grad():
        assert torch.equal(fused(input_ids=ids).logits, plain(input_ids=ids).logits)
        assert torch.equal(_decode(fused, ids, 4)[0], _decode(plain, ids, 4)[0])
    with torch.inference_mode():  # the rollout engine's mode: inference tensors have no version counter
        assert torch.equal(_decode(fused, ids, 8)[0], _decode(plain, ids, 8)[0])


def test_fused_executor_follows_weight_sync_like_the_per_linear_one():
    learner = _model_with_bias()
    qcfg = QuantConfig(w_granularity="tensor")
    fused, plain = make_executor(learner, qcfg), make_executor(learner, qcfg, fuse=False)
    ids = torch.randint(0, 128, (2, 9))
    with torch.no_grad():
        for p in learner.parameters():
            p.mul_(1.2).add_(0.01 * torch.randn_like(p))
        sync_weights(learner, fused)
        sync_weights(learner, plain)
        a, b = fused(input_ids=ids).logits, plain(input_ids=ids).logits
        fresh = make_executor(learner, qcfg, fuse=False)(input_ids=ids).logits
    assert torch.equal(a, b) and torch.equal(a, fresh)


def test_fused_executor_keeps_one_copy_of_the_codes():
    learner = tiny_causal_lm("llama")
    exe = make_executor(learner, QuantConfig())
    lin, _ = quantized_targets(learner, QuantConfig())
    codes = sum(b.numel() for n, b in exe.named_buffers() if n.endswith("weight_q"))
    assert codes == sum(m.weight.numel() for m in lin.values())  # sizes here are multiples of 8: no padding


# ---------------------------------------------------------------------------------------------- KV cache
@pytest.mark.parametrize("qcfg", [QuantConfig(), QuantConfig(kv_format="fp8_per_token_head", fp8_store="trunc"),
                                  QuantConfig(kv_format="fp8_tensor", kv_tensor_scale=0.25), QuantConfig(kv_bits=4)],
                         ids=["int8", "fp8_token_trunc", "fp8_tensor", "int4"])
def test_kv_pair_quantization_equals_two_calls(qcfg):
    k, v = torch.randn(2, 3, 5, 16) * 4, torch.randn(2, 3, 5, 16)
    kq, ks, vq, vs = QuantKVLayer._quantize_pair(k, v, qcfg)
    for (q, s), (rq, rs) in zip(((kq, ks), (vq, vs)), (P.quant_kv(k, qcfg), P.quant_kv(v, qcfg))):
        assert q.dtype == rq.dtype and torch.equal(q.view(torch.uint8), rq.view(torch.uint8)) and torch.equal(s, rs)


@pytest.mark.parametrize("kind", ["llama", "qwen3_moe"])
def test_kv_cache_storages_read_the_same_values(kind):
    """The three storages: the dequantized copy (``codes+dequantized``, each token dequantized once and appended)
    and the dequantized values alone (``dequantized``, the default) give the codes cache's logits and reads bit for
    bit, through row selection, crop, repeat and reorder; the codes are the same, the memory as documented."""
    exe = make_executor(tiny_causal_lm(kind, dtype=torch.bfloat16), QuantConfig())
    ids = torch.randint(0, 128, (3, 10))
    with torch.no_grad():
        plain, cp = _decode(exe, ids, 4, storage="codes")
        kept, ck = _decode(exe, ids, 4, keep_dequantized=True)
        only, co = _decode(exe, ids, 4)
    assert torch.equal(plain, kept) and torch.equal(plain, only)
    assert co.storage == "dequantized" and co.layers[0].keys.dtype == torch.bfloat16
    for a, b, c in zip(cp.layers, ck.layers, co.layers):
        assert torch.equal(a.keys, b.keys) and torch.equal(a.value_scales, b.value_scales)
        assert b.nbytes() == a.nbytes() == c.nbytes() and b.resident_nbytes() == a.nbytes() + 2 * b.keys.numel() * 2
        assert c.resident_nbytes() == 2 * c.keys.numel() * 2
    for op in (lambda c: c.batch_select_indices(torch.tensor([2, 0])), lambda c: c.crop(-3),
               lambda c: c.batch_repeat_interleave(2), lambda c: c.reorder_cache(torch.tensor([1, 0, 3, 2]))):
        for cache in (cp, ck, co):
            op(cache)
        z = torch.zeros(cp.layers[0].keys.shape[0], cp.layers[0].keys.shape[1], 0, cp.layers[0].keys.shape[-1])
        for a, b, c in zip(cp.layers, ck.layers, co.layers):
            ka, va = a.update(z.bfloat16(), z.bfloat16())
            kb, vb = b.update(z.bfloat16(), z.bfloat16())
            kc, vc = c.update(z.bfloat16(), z.bfloat16())
            assert torch.equal(ka, kb) and torch.equal(va, vb) and torch.equal(ka, kc) and torch.equal(va, vc)
    ck.reset()
    assert ck.get_seq_length() == 0 and ck.layers[0].keys_dequantized is None
