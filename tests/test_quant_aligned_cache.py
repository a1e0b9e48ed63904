"""The aligned learner's weight cache: fake-quantized weights computed once per optimizer step give the
same logits and the same gradients, bit for bit, as re-quantizing on every forward, and never a stale value."""

import copy

import pytest
import torch

from interq.quant import QuantConfig, aligned
from interq.quant import primitives as P
from interq.quant.aligned import _FQ_CACHE, clear_aligned_cache
from interq.quant.testing import tiny_causal_lm


def _step_pair(kind, qcfg, steps=2):
    """Two identical learners trained side by side with AdamW, aligned forward with and without the cache; per step
    a no-grad (proximal) forward and two grad micro-batches. Yields both sides' logits and gradients."""
    a = tiny_causal_lm(kind, num_layers=2)
    b = copy.deepcopy(a)
    a.train()
    b.train()
    opt_a = torch.optim.AdamW(a.parameters(), lr=3e-2)
    opt_b = torch.optim.AdamW(b.parameters(), lr=3e-2)
    g = torch.Generator().manual_seed(5)
    for _ in range(steps):
        ids = torch.randint(0, 128, (2, 3, 12), generator=g)
        out = {}
        for name, model, opt, cache in (("cached", a, opt_a, True), ("plain", b, opt_b, False)):
            opt.zero_grad()
            with torch.no_grad(), aligned(model, qcfg, cache_weights=cache):
                proximal = model(input_ids=ids[0]).logits
            logits = []
            for mb in ids:  # two micro-batches of one step: gradients accumulate
                with aligned(model, qcfg, cache_weights=cache):
                    lg = model(input_ids=mb).logits
                torch.log_softmax(lg.float(), -1)[..., :5].mean().backward()
                logits.append(lg.detach())
            grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
            opt.step()
            out[name] = (proximal, logits, grads)
        yield out


@pytest.mark.parametrize("kind,qcfg", [
    ("llama", QuantConfig()),
    ("qwen3", QuantConfig(w_granularity="tensor", w_bits=4, a_bits=6, kv_bits=4)),  # group-shared amax
    ("qwen3_moe", QuantConfig()),  # fused 3-D experts
    ("qwen3", QuantConfig(w_format="fp8_e4m3", w_granularity="block128", kv_format="fp8_per_token_head")),
], ids=["llama-int8", "qwen3-int4-tensor", "qwen3_moe-int8", "qwen3-fp8-block128"])
def test_cached_weights_give_the_same_logits_and_gradients_across_optimizer_steps(kind, qcfg):
    for step, out in enumerate(_step_pair(kind, qcfg)):
        (pa, la, ga), (pb, lb, gb) = out["cached"], out["plain"]
        assert torch.equal(pa, pb), f"step {step}: proximal logits differ"
        assert all(torch.equal(x, y) for x, y in zip(la, lb)), f"step {step}: logits differ"
        assert ga.keys() == gb.keys() and len(ga) > 0
        for n in ga:
            assert torch.equal(ga[n], gb[n]), f"step {step}: gradient of {n} differs"


def test_weights_fake_quantized_once_per_step_and_after_any_in_place_change(monkeypatch):
    calls = []
    real = P.fake_quant_weight
    monkeypatch.setattr(P, "fake_quant_weight", lambda *a, **k: calls.append(1) or real(*a, **k))
    model = tiny_causal_lm("llama", num_layers=2)
    n_quantized = 2 * 7
    ids = torch.randint(0, 128, (2, 8))
    with aligned(model, QuantConfig()):
        model(input_ids=ids)
        model(input_ids=ids)
    with aligned(model, QuantConfig()):  # a later context (the next micro-batch) reuses them too
        first = model(input_ids=ids).logits
    assert len(calls) == n_quantized
    with torch.no_grad():
        model.model.layers[0].mlp.up_proj.weight.add_(0.05)  # in place: its version counter moves
    with aligned(model, QuantConfig()):
        second = model(input_ids=ids).logits
    assert len(calls) == n_quantized + 1 and not torch.equal(first, second)
    model.model.layers[1].mlp.up_proj.weight.data = model.model.layers[1].mlp.up_proj.weight.data * 2  # new tensor
    with aligned(model, QuantConfig()):
        model(input_ids=ids)
    assert len(calls) == n_quantized + 2
    with aligned(model, QuantConfig(w_bits=4)):  # another config: its own values
        model(input_ids=ids)
    assert len(calls) == 2 * n_quantized + 2
    model.model.layers[1].mlp.down_proj.weight.data.mul_(3)  # through .data: no version bump, hence...
    clear_aligned_cache(model)  # ...the documented remedy
    assert not any(m in _FQ_CACHE for m in model.modules())
    with torch.no_grad():
        with aligned(model, QuantConfig(w_bits=4)):
            cached = model(input_ids=ids).logits
        with aligned(model, QuantConfig(w_bits=4), cache_weights=False):
            uncached_after_data_write = model(input_ids=ids).logits
    assert torch.equal(cached, uncached_after_data_write)


def test_cache_is_not_carried_by_a_deep_copy():
    model = tiny_causal_lm("llama", num_layers=1)
    with torch.no_grad(), aligned(model, QuantConfig()):
        model(input_ids=torch.randint(0, 128, (1, 4)))
    assert any(m in _FQ_CACHE for m in model.modules())
    clone = copy.deepcopy(model)
    assert not any(m in _FQ_CACHE for m in clone.modules())
