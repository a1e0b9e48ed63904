"""KV caches that append in place (interq.quant.kv_buffer): the same values as concatenation, in place while the
buffer has room, a new buffer otherwise; the same decode logits, rollouts and attention bits as transformers'
concatenating cache."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from interq.quant import QuantConfig, make_executor, make_kv_cache
from interq.quant import kv_cache as KV
from interq.quant.kv_cache import STORAGES
from interq.quant.testing import tiny_causal_lm
from interq.rollout import RolloutEngine, SamplingParams
from interq.quant import kv_buffer as KB
from interq.rollout.fast_layers import set_rollout_attention
from interq.quant.kv_buffer import GrowingLayer, append_columns, growing_dynamic_cache


def _cat_columns(cur, new, buffers, name):
    """The reference: what transformers' DynamicLayer does."""
    return new.clone() if cur is None or cur.numel() == 0 else torch.cat([cur, new], dim=-2)


def test_appends_equal_concatenation_in_place_until_full():
    g = torch.Generator().manual_seed(0)
    buffers, cur, ref = {}, None, None
    ptrs, grown = [], 0
    for n in (5, 1, 1, 3, 70, 1, 1, 200, 1):
        new = torch.randn(2, 3, n, 4, generator=g)
        before = buffers.get("k")
        cur = append_columns(cur, new, buffers, "k")
        ref = new.clone() if ref is None else torch.cat([ref, new], dim=-2)
        assert torch.equal(cur, ref) and cur.shape == ref.shape
        assert cur.data_ptr() == buffers["k"].data_ptr() and buffers["k"].shape[-2] >= cur.shape[-2]
        grown += buffers["k"] is not before
        ptrs.append(cur.data_ptr())
    assert grown == 3  # the first append, the 70 columns past the first 64 spare, the 200 past the next capacity
    assert ptrs[1] == ptrs[0] and ptrs[2] == ptrs[0]  # single columns written in place
    assert buffers["k"].shape[-2] == KB._capacity(5 + 1 + 1 + 3 + 70 + 1 + 1 + 200)


def test_cropped_prefix_keeps_appending_in_place_and_foreign_tensors_move_into_a_new_buffer():
    buffers = {}
    a = torch.arange(2 * 10 * 2, dtype=torch.float32).reshape(1, 2, 10, 2)
    cur = append_columns(None, a, buffers, "k")
    ptr = buffers["k"].data_ptr()
    cur = cur[..., :-3, :]  # crop, as DynamicLayer.crop does
    new = torch.full((1, 2, 2, 2), -1.0)
    cur = append_columns(cur, new, buffers, "k")
    assert buffers["k"].data_ptr() == ptr and torch.equal(cur, torch.cat([a[..., :7, :], new], dim=-2))
    rows = cur.index_select(-2, torch.tensor([0, 2, 4]))  # column compaction or row selection: a new tensor
    cur = append_columns(rows, new, buffers, "k")
    assert buffers["k"].data_ptr() != ptr and torch.equal(cur, torch.cat([rows, new], dim=-2))
    other = torch.zeros(1, 2, 40, 2)[..., :3, :]  # a prefix view of somebody else's tensor is not ours to write
    cur = append_columns(other, new, buffers, "k")
    assert torch.equal(cur, torch.cat([other, new], dim=-2)) and torch.equal(other, torch.zeros(1, 2, 3, 2))


def test_tensors_needing_gradients_are_concatenated():
    buffers = {}
    w = torch.randn(1, 1, 3, 2, requires_grad=True)
    cur = append_columns(None, w * 2, buffers, "k")
    cur = append_columns(cur, w * 3, buffers, "k")
    assert not buffers and cur.shape == (1, 1, 6, 2)
    cur.sum().backward()
    assert torch.equal(w.grad, torch.full_like(w, 5.0))


def test_a_buffer_made_under_inference_mode_is_replaced_outside_it():
    buffers = {}
    with torch.inference_mode():
        cur = append_columns(None, torch.ones(1, 1, 2, 2), buffers, "k")
    with torch.no_grad():
        out = append_columns(cur, torch.zeros(1, 1, 1, 2), buffers, "k")
    assert not buffers["k"].is_inference() and torch.equal(out[..., :2, :], torch.ones(1, 1, 2, 2))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("masked", [False, True])
def test_flash_attention_gives_the_same_bits_on_buffer_views(dtype, masked):
    g = torch.Generator().manual_seed(3)
    b, hkv, groups, t, d = 4, 3, 3, 300, 64
    q = torch.randn(b, hkv, groups, d, generator=g).to(dtype)  # packed decode: G query heads as rows
    k, v = (torch.randn(b, hkv, t, d, generator=g).to(dtype) for _ in range(2))
    mask = torch.ones(b, 1, 1, t, dtype=torch.bool)
    mask[0, ..., :17] = False
    buffers = {}
    kv = [append_columns(None, x, buffers, n) for x, n in ((k, "k"), (v, "v"))]
    assert kv[0].stride() != k.stride()  # really a strided view
    m = mask if masked else None
    assert torch.equal(F.scaled_dot_product_attention(q, k, v, attn_mask=m),
                       F.scaled_dot_product_attention(q, *kv, attn_mask=m))


def _greedy(model, cache, ids, mask, steps):
    out = model(input_ids=ids, attention_mask=mask, cache=cache, use_cache=True)
    logits = [out.logits[:, -1]]
    for _ in range(steps):
        tok = out.logits[:, -1].argmax(-1, keepdim=True)
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        out = model(input_ids=tok, attention_mask=mask, cache=out.cache, use_cache=True)
        logits.append(out.logits[:, -1])
    return torch.stack(logits, 1), out.cache


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_growing_dynamic_cache_decodes_the_same_logits(arch, dtype):
    model = set_rollout_attention(tiny_causal_lm(arch).to(dtype).eval(), "sdpa_packed")
    cache = growing_dynamic_cache(model.config)
    assert type(cache) is DynamicCache and all(type(layer) is GrowingLayer for layer in cache.layers)
    assert type(make_kv_cache(QuantConfig(kv_format="none"), model.config).layers[0]) is GrowingLayer
    ids = torch.randint(4, model.config.vocab_size, (3, 9), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, :4] = 0  # a left-padded row
    with torch.inference_mode():
        ours, c1 = _greedy(model, cache, ids, mask, 80)  # past the first buffer's spare columns
        ref, c2 = _greedy(model, DynamicCache(config=model.config), ids, mask, 80)
    assert torch.equal(ours, ref)
    assert torch.equal(c1.layers[0].keys, c2.layers[0].keys) and c1.layers[0].keys.shape[-2] == 89
    lazy = growing_dynamic_cache()
    with torch.inference_mode():
        assert torch.equal(_greedy(model, lazy, ids, mask, 3)[0], ref[:, :4])
    assert type(lazy.layers[0]) is GrowingLayer


@pytest.mark.parametrize("storage", STORAGES)
def test_quantized_cache_appending_in_place_reads_what_concatenation_reads(storage, monkeypatch):
    exe = set_rollout_attention(make_executor(tiny_causal_lm("llama").to(torch.bfloat16)), "sdpa_packed")
    ids = torch.randint(4, exe.config.vocab_size, (2, 7), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    mask[0, :2] = 0
    with torch.inference_mode():
        ours, c1 = _greedy(exe, make_kv_cache(exe.interq_qcfg, exe.config, storage=storage), ids, mask, 70)
        monkeypatch.setattr(KV, "append_columns", _cat_columns)
        ref, c2 = _greedy(exe, make_kv_cache(exe.interq_qcfg, exe.config, storage=storage), ids, mask, 70)
    assert torch.equal(ours, ref)
    assert c1.layers[0].buffers and not c2.layers[0].buffers
    for name in ("keys", "values", "key_scales", "value_scales", "keys_dequantized", "values_dequantized"):
        a, b = getattr(c1.layers[1], name), getattr(c2.layers[1], name)
        assert (a is None and b is None) or torch.equal(a, b)
    c1.crop(-5)
    c1.batch_select_indices(torch.tensor([1]))
    assert c1.get_seq_length() == 72 and c1.layers[0].keys.shape[0] == 1


def test_engine_rollouts_equal_those_of_transformers_cache():
    """Rows finishing at different turns (row selection, column compaction) and waiting episodes, bf16 packed
    decode: the default cache gives the trajectories of transformers' concatenating DynamicCache, bit for bit."""
    model = set_rollout_attention(tiny_causal_lm("qwen3").to(torch.bfloat16).eval(), "sdpa_packed")
    sampling = SamplingParams(temperature=1.0, max_action_tokens=6, stop_token_ids=(3,))
    g = torch.Generator().manual_seed(4)
    obs = [[torch.randint(4, 90, (int(torch.randint(1, 20, (1,), generator=g)),), generator=g).tolist()
            for _ in range(4)] for _ in range(5)]
    out = {}
    for name, factory in (("ours", None), ("hf", lambda c: DynamicCache(config=c))):
        engine = RolloutEngine(model, cache_factory=factory)
        batch = engine.new_batch([1, 2, 3, 4, 5], sampling)
        done = []
        for t in range(4):
            batch.step({i: obs[i][t] for i in batch.live if not (t == 1 and i == 2)})  # episode 2 waits a turn
            if t == 1:
                done += batch.finish_many([0, 3])
            if t == 2:
                assert isinstance(batch._cache.layers[0], GrowingLayer if name == "ours" else DynamicLayer)
        done += batch.finish_many(list(batch.live))
        out[name] = sorted(done, key=lambda tr: tr.episode)
    for a, b in zip(out["ours"], out["hf"]):
        assert torch.equal(a.token_ids, b.token_ids) and torch.equal(a.behavior_logprobs, b.behavior_logprobs)
