"""The 8-bit KV cache (docs/executor.md, "Formats"): quantize once at write, dequantize on read, row ops."""

import pytest
import torch
from transformers import DynamicCache

from interq.quant import QuantConfig, QuantKVCache, kv_bytes_per_token, make_executor, make_kv_cache
from interq.quant import primitives as P
from interq.quant.kv_cache import STORAGES
from interq.quant.testing import tiny_causal_lm


def test_none_gives_plain_dynamic_cache():
    m = tiny_causal_lm("llama")
    assert type(make_kv_cache(QuantConfig(kv_format="none"), m.config)) is DynamicCache
    assert isinstance(make_kv_cache(QuantConfig(), m.config), QuantKVCache)


@pytest.mark.parametrize("fmt", ["int8_per_token_head", "fp8_per_token_head"])
def test_kv_bytes_per_token_about_half_of_bf16(fmt):
    learner = tiny_causal_lm("llama", head_dim=64, hidden_size=128, num_heads=2, num_kv_heads=1, dtype=torch.bfloat16)
    ids = torch.randint(0, 128, (3, 9))
    with torch.no_grad():
        ref = DynamicCache(config=learner.config)
        learner(input_ids=ids, cache=ref, use_cache=True)
        exe = make_executor(learner, QuantConfig(kv_format=fmt))
        cache = make_kv_cache(exe.interq_qcfg, exe.config)
        exe(input_ids=ids, cache=cache, use_cache=True)
    b_ref, b_q = kv_bytes_per_token(ref), kv_bytes_per_token(cache)
    assert b_ref == 2 * 2 * 1 * 64 * 2  # layers x (K, V) x heads x head_dim x bf16
    assert b_q / b_ref == pytest.approx((64 + 4) / 128)  # int8/e4m3 codes + one fp32 scale per token-head
    assert b_q / b_ref <= 0.55


@pytest.mark.parametrize("storage", STORAGES)
def test_each_token_quantized_once_and_read_dequantized(storage):
    qcfg = QuantConfig()
    cache = make_kv_cache(qcfg, tiny_causal_lm("llama").config, storage=storage)
    k1, v1 = torch.randn(2, 2, 5, 16), torch.randn(2, 2, 5, 16)
    k_out, v_out = cache.update(k1, v1, 0)
    layer = cache.layers[0]
    if storage != "dequantized":
        codes, scales = layer.keys.clone(), layer.key_scales.clone()
        assert codes.dtype == torch.int8 and codes.shape == (2, 2, 5, 16) and scales.shape == (2, 2, 5, 1)
    else:  # only what attention reads: the dequantized values, in the compute dtype
        assert layer.keys.dtype == k1.dtype and layer.key_scales is None and torch.equal(layer.keys, k_out)
    assert torch.equal(k_out, P.fake_quant_kv(k1, qcfg)) and torch.equal(v_out, P.fake_quant_kv(v1, qcfg))
    for _ in range(3):  # decode steps append; stored codes of earlier tokens never change
        k_out, _ = cache.update(torch.randn(2, 2, 1, 16) * 10, torch.randn(2, 2, 1, 16), 0)
    if storage != "dequantized":
        assert torch.equal(layer.keys[..., :5, :], codes) and torch.equal(layer.key_scales[..., :5, :], scales)
    assert cache.get_seq_length() == 8 and k_out.shape == (2, 2, 8, 16)
    assert torch.equal(k_out[..., :5, :], P.fake_quant_kv(k1, qcfg))
    # the memory of a quantized-KV engine in every storage: a byte per code, an fp32 scale per token and head
    assert layer.nbytes() == 2 * (2 * 2 * 8 * 16 + 4 * 2 * 2 * 8)
    held = {"codes": layer.nbytes(), "dequantized": 2 * 2 * 2 * 8 * 16 * 4,
            "codes+dequantized": layer.nbytes() + 2 * 2 * 2 * 8 * 16 * 4}[storage]
    assert layer.resident_nbytes() == held


def test_storage_is_validated():
    cfg = tiny_causal_lm("llama").config
    with pytest.raises(ValueError, match="storage must be one of"):
        make_kv_cache(QuantConfig(), cfg, storage="int8")
    with pytest.raises(ValueError, match="keep_dequantized=True is storage='codes\\+dequantized'"):
        make_kv_cache(QuantConfig(), cfg, keep_dequantized=True, storage="codes")
    assert make_kv_cache(QuantConfig(), cfg, keep_dequantized=True).storage == "codes+dequantized"
    assert make_kv_cache(QuantConfig(), cfg).storage == "dequantized"


def test_row_selection_crop_repeat_reorder():
    qcfg = QuantConfig(kv_format="fp8_per_token_head")
    cache = make_kv_cache(qcfg, tiny_causal_lm("llama").config, storage="codes")
    k, v = torch.randn(3, 2, 4, 16), torch.randn(3, 2, 4, 16)
    full_k, _ = cache.update(k, v, 0)
    cache.batch_select_indices(torch.tensor([0, 2]))
    k2, _ = cache.update(torch.zeros(2, 2, 0, 16), torch.zeros(2, 2, 0, 16), 0)
    assert torch.equal(k2, full_k[[0, 2]])
    cache.reorder_cache(torch.tensor([1, 0]))
    assert torch.equal(cache.layers[0].key_scales[0], P.quant_kv(k[2:3], qcfg)[1][0])
    cache.crop(-1)
    assert cache.get_seq_length() == 3 and cache.layers[0].key_scales.shape[-2] == 3
    cache.batch_repeat_interleave(2)
    assert cache.layers[0].keys.shape[0] == 4 and cache.layers[0].value_scales.shape[0] == 4
    with pytest.raises(ValueError, match="negative"):
        cache.crop(2)
    cache.reset()
    assert cache.get_seq_length() == 0


def _decode(exe, ids, n_prompt):
    cache = make_kv_cache(exe.interq_qcfg, exe.config)
    out = exe(input_ids=ids[:, :n_prompt], cache=cache, use_cache=True)
    logits = [out.logits]
    for t in range(n_prompt, ids.shape[1]):
        out = exe(input_ids=ids[:, t:t + 1], cache=out.cache, use_cache=True)
        logits.append(out.logits)
    return torch.cat(logits, dim=1), cache


@pytest.mark.parametrize("kind", ["llama", "qwen3_moe"])
def test_decode_matches_prefill_and_dropping_rows_matches_running_alone(kind):
    exe = make_executor(tiny_causal_lm(kind), QuantConfig())
    ids = torch.randint(0, 128, (3, 12))
    with torch.no_grad():
        prefill = exe(input_ids=ids).logits  # [3, 12, V]
        dec, cache = _decode(exe, ids, 5)
        # token-by-token decode against the quantized cache = one prefill up to fp32 rounding (fp32 model)
        assert (dec - prefill).abs().max() < 1e-3
        # drop row 1 mid-way, continue: the kept rows equal running them alone (per-token scales: batch-invariant)
        cache = make_kv_cache(exe.interq_qcfg, exe.config)
        out = exe(input_ids=ids[:, :6], cache=cache, use_cache=True)
        cache.batch_select_indices(torch.tensor([0, 2]))
        out = exe(input_ids=ids[[0, 2], 6:7], cache=cache, use_cache=True)
        alone = exe(input_ids=ids[[0, 2], :7]).logits[:, -1]
    assert (out.logits[:, -1] - alone).abs().max() < 1e-4


def test_executor_injects_quantized_cache_when_none_given():
    exe = make_executor(tiny_causal_lm("llama"), QuantConfig())
    with torch.no_grad():
        out = exe(input_ids=torch.randint(0, 128, (1, 4)), use_cache=True)
    assert isinstance(out.cache, QuantKVCache)


def test_kv_format_none_or_sliding_layers_rejected_for_quant_layer():
    m = tiny_causal_lm("qwen3")
    m.config.layer_types = ["sliding_attention"] * m.config.num_hidden_layers
    with pytest.raises(NotImplementedError, match="sliding_attention"):
        make_kv_cache(QuantConfig(), m.config)


@pytest.mark.parametrize("bits", [2, 3, 4, 6])
def test_narrow_kv_codes_stored_in_int8_and_read_dequantized(bits):
    """kv_bits < 8: codes in [-qmax, qmax], one per int8 byte (not packed), read back as fake_quant_kv."""
    qmax = 2 ** (bits - 1) - 1
    qcfg = QuantConfig(kv_bits=bits)
    cfg = tiny_causal_lm("llama").config
    cache, cache8 = make_kv_cache(qcfg, cfg, storage="codes"), make_kv_cache(QuantConfig(), cfg, storage="codes")
    k, v = torch.randn(2, 2, 6, 16) * 3, torch.randn(2, 2, 6, 16)
    k_out, v_out = cache.update(k, v, 0)
    cache8.update(k, v, 0)
    layer = cache.layers[0]
    assert layer.keys.dtype == torch.int8 and layer.keys.abs().max() == qmax and layer.values.abs().max() == qmax
    assert torch.equal(k_out, P.fake_quant_kv(k, qcfg)) and torch.equal(v_out, P.fake_quant_kv(v, qcfg))
    err, err8 = (k_out - k).abs().mean(), (P.fake_quant_kv(k, QuantConfig()) - k).abs().mean()
    assert err > 1.5 * err8  # a coarser cache, really
    assert cache.layers[0].nbytes() == cache8.layers[0].nbytes()  # same int8 storage


def test_w4a4_kv4_decode_matches_prefill_and_rows_are_batch_invariant():
    exe = make_executor(tiny_causal_lm("qwen3"), QuantConfig(w_bits=4, a_bits=4, kv_bits=4))
    ids = torch.randint(0, 128, (3, 12))
    with torch.no_grad():
        prefill = exe(input_ids=ids).logits
        dec, _ = _decode(exe, ids, 5)
        alone = exe(input_ids=ids[1:2]).logits
    assert (dec - prefill).abs().max() < 1e-3
    assert (alone - prefill[1:2]).abs().max() < 1e-4


@pytest.mark.parametrize("qcfg", [QuantConfig(kv_format="fp8_per_token_head"), QuantConfig(kv_format="fp8_tensor"),
                                  QuantConfig(kv_bits=4), QuantConfig(kv_int8_store="trunc")],
                         ids=["fp8_token", "fp8_tensor", "int4", "int8_trunc"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dequantized_storage_reads_what_the_codes_read(qcfg, dtype):
    cfg = tiny_causal_lm("llama").config
    codes, only = make_kv_cache(qcfg, cfg, storage="codes"), make_kv_cache(qcfg, cfg, storage="dequantized")
    for t in (5, 1, 1):
        k, v = (torch.randn(2, 2, t, 16) * 3).to(dtype), torch.randn(2, 2, t, 16).to(dtype)
        for a, b in zip(codes.update(k, v, 0), only.update(k, v, 0)):
            assert a.dtype == b.dtype == dtype and torch.equal(a, b)
