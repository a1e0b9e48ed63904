"""The W8A8 executor: real int8 GEMMs, module policy, weight sync
(docs/executor.md)."""

import pytest
import torch
from torch import nn

from interq.quant import (QuantConfig, QuantExperts, QuantLinear, fp8_linear, int_mm_padded, make_executor,
                          sync_weights)
from interq.quant.linear import FusedQuantLinear, FusedQuantSlice, int_mm_fp32_exact, resolve_int8_backend
from interq.quant import primitives as P
from interq.quant.testing import tiny_causal_lm


@pytest.mark.parametrize("m,k,n", [(1, 8, 8), (3, 12, 20), (17, 64, 40), (5, 7, 3)])
def test_int_mm_padded_exact(m, k, n):
    a = torch.randint(-128, 128, (m, k), dtype=torch.int8)
    b = torch.randint(-128, 128, (k, n), dtype=torch.int8)
    out = int_mm_padded(a, b)
    assert out.dtype == torch.int32 and out.shape == (m, n)
    assert torch.equal(out.long(), a.long() @ b.long())


def _linear(k, n, bias):
    torch.manual_seed(1)
    lin = nn.Linear(k, n, bias=bias)
    with torch.no_grad():
        lin.weight.normal_(0, 0.05)
        if bias:
            lin.bias.normal_(0, 0.1)
    return lin


@pytest.mark.parametrize("k", [100, 1024, 2500])
def test_fp32_exact_backend_equals_int_mm_at_the_worst_case(k):
    """fp32 GEMM of int8 codes in K-chunks of 1024 is exact even when every product is +-128*127."""
    a = torch.full((3, k), -128, dtype=torch.int8)
    a[1] = torch.randint(-128, 128, (k,), dtype=torch.int8)
    b = torch.full((k, 5), -127, dtype=torch.int8)
    b[:, 1:] = torch.randint(-128, 128, (k, 4), dtype=torch.int8)
    ref = (a.long() @ b.long())
    assert torch.equal(int_mm_fp32_exact(a, b.float()).long(), ref)
    assert torch.equal(int_mm_padded(a, b).long(), ref)


def test_int8_backend_choice_is_validated():
    with pytest.raises(ValueError, match="int8_backend"):
        resolve_int8_backend("fbgemm")
    assert resolve_int8_backend("auto") in ("int_mm", "fp32_exact", "vnni", "amx", "avx2")


@pytest.mark.parametrize("backend", ["int_mm", "fp32_exact"])
@pytest.mark.parametrize("bias", [False, True])
def test_int8_linear_is_the_cutlass_epilogue_bit_exact(bias, backend):
    lin = _linear(40, 24, bias)  # K, N not multiples of 16: padded path
    ql = QuantLinear(lin, QuantConfig(), int8_backend=backend)
    assert ql.int8_backend == backend
    x = torch.randn(2, 5, 40)
    y = ql(x)  # [2, 5, 24]
    # independent reference: int64 matmul of the codes, then s_a * (s_w * acc) (+ bias by fp64 fma)
    qx, sa = P.quant_act_int8_token(x.reshape(-1, 40))
    qw, sw = P.quant_weight_int8(lin.weight)
    acc = (qx.long() @ qw.long().t()).float()  # [10, 24]
    t = sw.reshape(-1) * acc
    ref = sa * t if not bias else (sa.double() * t.double() + lin.bias.double()).float()
    assert torch.equal(y.reshape(-1, 24), ref)


def test_int8_linear_against_dequantized_float_reference():
    lin = _linear(64, 32, True)
    ql = QuantLinear(lin, QuantConfig())
    x = torch.randn(7, 64)
    ref = (P.fake_quant_activation(x, QuantConfig()).double() @ P.fake_quant_weight(lin.weight, QuantConfig()).double().t()
           + lin.bias.double())
    y = ql(x)
    # same math up to fp32 rounding of the epilogue: relative 1e-6 of the output scale
    assert (y.double() - ref).abs().max() <= 1e-6 * ref.abs().max()
    # and it is genuinely quantized: the error against the float linear is ~1e-2 relative, not zero
    rel = ((y - lin(x)).norm() / lin(x).norm()).item()
    assert 1e-3 < rel < 5e-2


@pytest.mark.parametrize("gran", ["tensor", "channel", "block128"])
def test_fp8_linear_against_dequantized_float64_reference(gran):
    qcfg = QuantConfig(w_format="fp8_e4m3", w_granularity=gran)
    lin = _linear(200, 136, False)
    ql = QuantLinear(lin, qcfg)
    x = torch.randn(6, 200)
    y = ql(x)
    ref = P.fake_quant_activation(x, qcfg).double() @ P.fake_quant_weight(lin.weight, qcfg).double().t()
    assert (y.double() - ref).abs().max() <= 1e-6 * ref.abs().max()
    rel = ((y - lin(x)).norm() / lin(x).norm()).item()
    assert 5e-3 < rel < 0.1  # e4m3 error, larger than int8's


def test_fp8_linear_is_batch_invariant():
    qcfg = QuantConfig(w_format="fp8_e4m3", w_granularity="channel")
    lin = _linear(64, 16, False)
    q, s = P.quant_weight_fp8(lin.weight, "channel")
    x = torch.randn(9, 64)
    full = fp8_linear(x, q, s, None, "token", "channel", torch.float32)
    rows = torch.cat([fp8_linear(x[i:i + 1], q, s, None, "token", "channel", torch.float32) for i in range(9)])
    assert torch.equal(full, rows)
    del qcfg


@pytest.mark.parametrize("kind", ["llama", "qwen3", "qwen3_moe"])
def test_executor_module_policy_and_learner_untouched(kind):
    learner = tiny_causal_lm(kind)
    before = {k: v.clone() for k, v in learner.state_dict().items()}
    exe = make_executor(learner, QuantConfig())
    assert exe is not learner
    # learner: unchanged weights, still plain nn.Linear
    assert all(torch.equal(before[k], v) for k, v in learner.state_dict().items())
    quant_modules = (QuantLinear, FusedQuantLinear, FusedQuantSlice, QuantExperts)
    assert not any(isinstance(m, quant_modules) for m in learner.modules())
    names = dict(exe.named_modules())
    for i in range(learner.config.num_hidden_layers):
        for proj in ("q_proj", "k_proj", "v_proj"):  # one fused int8 GEMM, members left under their names
            assert isinstance(names[f"model.layers.{i}.self_attn.{proj}"], FusedQuantSlice)
        assert isinstance(names[f"model.layers.{i}.self_attn.qkv_proj"], FusedQuantLinear)
        assert isinstance(names[f"model.layers.{i}.self_attn.o_proj"], QuantLinear)
        if kind == "qwen3_moe":
            assert isinstance(names[f"model.layers.{i}.mlp.experts"], QuantExperts)
            router = names[f"model.layers.{i}.mlp.gate"]
            assert torch.equal(router.weight, learner.get_submodule(f"model.layers.{i}.mlp.gate").weight)
        else:
            for proj in ("gate_proj", "up_proj"):
                assert isinstance(names[f"model.layers.{i}.mlp.{proj}"], FusedQuantSlice)
            assert isinstance(names[f"model.layers.{i}.mlp.down_proj"], QuantLinear)
    # everything left as a parameter is high precision and bit-identical to the learner's
    kept = dict(exe.named_parameters())
    assert kept, "embeddings / norms / lm_head should remain parameters"
    for name, p in kept.items():
        assert p.dtype == torch.float32 and torch.equal(p, learner.get_parameter(name)), name
        assert any(s in name for s in ("embed_tokens", "lm_head", "norm", "mlp.gate")), name
    assert isinstance(exe.lm_head, nn.Linear) and isinstance(exe.model.embed_tokens, nn.Embedding)
    assert not any(p.requires_grad for p in exe.parameters()) and not exe.training


def test_executor_exclude_keeps_named_linears_in_high_precision():
    learner = tiny_causal_lm("llama")
    exe = make_executor(learner, QuantConfig(exclude=("o_proj",)))
    assert isinstance(exe.model.layers[0].self_attn.o_proj, nn.Linear)
    assert isinstance(exe.model.layers[0].self_attn.q_proj, FusedQuantSlice)
    # excluding one member of a fused group leaves the others as separate quantized linears
    exe = make_executor(learner, QuantConfig(exclude=("k_proj",)))
    attn = exe.model.layers[0].self_attn
    assert isinstance(attn.k_proj, nn.Linear) and not isinstance(attn.k_proj, (QuantLinear, FusedQuantSlice))
    assert isinstance(attn.q_proj, QuantLinear) and isinstance(attn.v_proj, QuantLinear)
    assert not hasattr(attn, "qkv_proj")


def test_fp8_tensor_scale_shared_over_fused_qkv_and_gate_up():
    learner = tiny_causal_lm("llama")
    exe = make_executor(learner, QuantConfig(w_format="fp8_e4m3", kv_format="none"))
    attn, mlp = exe.model.layers[0].self_attn, exe.model.layers[0].mlp
    s = {p: getattr(attn, p).weight_scale.item() for p in ("q_proj", "k_proj", "v_proj")}
    la = learner.model.layers[0].self_attn
    amax = max(getattr(la, p).weight.abs().max().item() for p in ("q_proj", "k_proj", "v_proj"))
    assert all(v == pytest.approx(amax / 448, rel=1e-6) for v in s.values())
    assert mlp.gate_proj.weight_scale.item() == mlp.up_proj.weight_scale.item()
    assert attn.o_proj.weight_scale.item() == pytest.approx(la.o_proj.weight.abs().max().item() / 448, rel=1e-6)


@pytest.mark.parametrize("kind", ["llama", "qwen3_moe"])
def test_sync_weights_executor_follows_changed_learner(kind):
    learner = tiny_causal_lm(kind)
    exe = make_executor(learner, QuantConfig(), int8_backend="fp32_exact")  # its packed codes must follow too
    ids = torch.randint(0, 128, (2, 10))
    with torch.no_grad():
        before = exe(input_ids=ids).logits
        for p in learner.parameters():
            p.mul_(1.3).add_(0.01 * torch.randn_like(p))
        stale = exe(input_ids=ids).logits
        assert torch.equal(before, stale)  # the executor is a copy: unchanged until synced
        seconds = sync_weights(learner, exe)
        synced = exe(input_ids=ids).logits
        fresh = make_executor(learner, QuantConfig())(input_ids=ids).logits
    assert isinstance(seconds, float) and seconds > 0
    assert not torch.allclose(synced, before, atol=1e-3)
    assert torch.equal(synced, fresh)  # scales recomputed: identical to a freshly converted executor


@pytest.mark.parametrize("kind", ["llama", "qwen3_moe"])
def test_int8_backends_give_bit_identical_executors(kind):
    learner = tiny_causal_lm(kind, dtype=torch.bfloat16)
    ids = torch.randint(0, 128, (2, 9))
    with torch.no_grad():
        a = make_executor(learner, QuantConfig(), int8_backend="int_mm")(input_ids=ids).logits
        b = make_executor(learner, QuantConfig(), int8_backend="fp32_exact")(input_ids=ids).logits
    assert torch.equal(a, b)


def test_bf16_executor_config_quantizes_nothing():
    learner = tiny_causal_lm("llama")
    exe = make_executor(learner, QuantConfig(w_format="none", kv_format="none"))
    assert not any(isinstance(m, QuantLinear) for m in exe.modules())
    ids = torch.randint(0, 128, (1, 6))
    with torch.no_grad():
        assert torch.equal(exe(input_ids=ids).logits, learner(input_ids=ids).logits)


def test_make_executor_rejects_non_config():
    with pytest.raises(TypeError, match="QuantConfig"):
        make_executor(tiny_causal_lm("llama"), {"w_format": "int8"})
