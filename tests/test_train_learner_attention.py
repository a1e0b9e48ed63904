"""train.learner_attention=kernel: the learner's causal self-attention by interq's CPU kernel.

The kernel (``causal_attention_fwd`` / ``_bwd`` in ``interq.quant.csrc``) is an fp32 computation of its own: its
output and its three gradients are checked against float64 (torch's SDPA in float64, and a naive softmax loop),
with tolerances that a wrong sign, a missing scale, a causal mask off by one or a lost GQA head would break by
orders of magnitude, at block boundaries (64 rows) and with non-contiguous inputs. In a model: the same log-probs
and gradients as transformers' sdpa to float rounding, the proximal (no-grad) and the training forward the same
bits, masked and non-causal calls left to sdpa, the model's implementation restored on exit. Config: ``auto``
resolves to ``kernel`` where the kernels load on a CPU with AVX-512 that is not Intel's, ``sdpa`` elsewhere; bad values
are named.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from interq import kernels
from interq.quant.testing import tiny_causal_lm
from interq.rollout import sequence_logprobs
from interq.train.config import LEARNER_ATTENTIONS, ConfigError, build_config, resolve_learner_attention
from interq.train.learner_attention import LEARNER_ATTENTIONS as MODULE_CHOICES
from interq.train.learner_attention import NAME, causal_attention, kernel_attention, learner_attention
from interq.train.rl import learner_context

pytestmark = pytest.mark.skipif(kernels.load() is None, reason="interq's CPU kernels cannot be built here")

TOL = 2e-5  # relative to the largest value; fp32 against float64 (measured <= 3e-6 at 1,760 tokens)


def _qkv(b, h, hkv, length, d, seed=0, layout="contiguous"):
    g = torch.Generator().manual_seed(seed)
    if layout == "transposed":  # as transformers makes them: [B, L, H, D] viewed as [B, H, L, D]
        q = torch.randn(b, length, h, d, generator=g).transpose(1, 2)
        k = torch.randn(b, length, hkv, d, generator=g).transpose(1, 2)
        v = torch.randn(b, length, hkv, d, generator=g).transpose(1, 2)
    else:
        q, k, v = (torch.randn(b, n, length, d, generator=g) for n in (h, hkv, hkv))
    return q, k, v


def _naive(q, k, v, scale):
    """softmax(q k^T scale, causal) v in float64 by loops over heads and rows: [B, L, H, D]."""
    b, h, length, d = q.shape
    g = h // k.shape[1]
    out = torch.zeros(b, length, h, d, dtype=torch.float64)
    for bi in range(b):
        for hi in range(h):
            kk, vv = k[bi, hi // g].double(), v[bi, hi // g].double()
            for r in range(length):
                s = (kk[: r + 1] @ q[bi, hi, r].double()) * scale  # [r + 1]
                out[bi, r, hi] = torch.softmax(s, 0) @ vv[: r + 1]
    return out


def _rel(a, b):
    """max |a - b| over max |b| (at least 0.1: a gradient that is 0 in exact arithmetic, dq at one token, is a
    difference of two rounded sums here)."""
    return float((a.detach().double() - b.detach().double()).abs().max() / max(float(b.detach().abs().max()), 0.1))


@pytest.mark.parametrize("b,h,hkv,length,d,layout", [
    (1, 4, 2, 1, 16, "contiguous"),      # one token
    (2, 4, 2, 63, 16, "transposed"),     # below a block
    (1, 3, 3, 64, 32, "contiguous"),     # one full block, no GQA
    (2, 9, 3, 130, 64, "transposed"),    # SmolLM2's heads, three blocks, the last of 2 rows
    (1, 2, 1, 100, 128, "contiguous"),   # Qwen3's head size
    (1, 2, 1, 70, 80, "contiguous"),     # a head size not a multiple of 64 (padded inside)
])
def test_forward_and_gradients_against_float64(b, h, hkv, length, d, layout):
    q, k, v = _qkv(b, h, hkv, length, d, layout=layout)
    scale = 0.7 / d ** 0.5
    g = torch.Generator().manual_seed(1)
    dout = torch.randn(b, length, h, d, generator=g)
    got = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out = causal_attention(*got, scale)
    out.backward(dout)
    ref = [t.detach().double().requires_grad_() for t in (q, k, v)]
    want = F.scaled_dot_product_attention(*ref, is_causal=True, scale=scale, enable_gqa=True).transpose(1, 2)
    want.backward(dout.double())
    assert out.shape == (b, length, h, d) and out.dtype == torch.float32
    assert _rel(out, want) < TOL, f"output error {_rel(out, want):.2e}"
    if length <= 64:
        assert _rel(out, _naive(q, k, v, scale)) < TOL
    for name, a, r in zip("qkv", got, ref):
        assert _rel(a.grad, r.grad) < TOL, f"d{name} error {_rel(a.grad, r.grad):.2e}"
        assert a.grad.shape == r.grad.shape


def test_a_wrong_sign_or_scale_would_be_caught():
    q, k, v = _qkv(1, 2, 1, 40, 16)
    out = causal_attention(q, k, v, 0.25)
    assert _rel(out, causal_attention(q, k, v, 0.3)) > 100 * TOL
    assert _rel(out, causal_attention(-q, k, v, 0.25)) > 100 * TOL
    noncausal = F.scaled_dot_product_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), scale=0.25)
    assert _rel(out, noncausal.transpose(1, 2)) > 100 * TOL


def test_no_grad_and_grad_forwards_are_the_same_bits():
    q, k, v = _qkv(2, 4, 2, 150, 64, layout="transposed")
    with torch.no_grad():
        a = causal_attention(q, k, v)
    b = causal_attention(q.clone().requires_grad_(), k.clone().requires_grad_(), v.clone().requires_grad_())
    assert torch.equal(a, b.detach())
    assert torch.equal(a, causal_attention(q.contiguous(), k.contiguous(), v.contiguous()))


def test_calls_the_kernel_cannot_take_are_sdpa_s():
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    model = tiny_causal_lm("llama")
    module = model.model.layers[0].self_attn
    q, k, v = _qkv(2, 4, 2, 20, 16)
    mask = torch.zeros(2, 1, 20, 20)
    mask[1, :, :, 15:] = float("-inf")
    for args, kw in (((q, k, v, mask), {}), ((q.double(), k.double(), v.double(), None), {}),
                     ((q, k, v, None), {"dropout": 0.1}), ((q[:, :, -1:], k, v, None), {})):
        got, _ = kernel_attention(module, *args, **kw)
        torch.manual_seed(0)
        if "dropout" in kw:
            continue  # random: only that it ran
        want, _ = sdpa_attention_forward(module, *args, **kw)
        assert torch.equal(got, want)


@pytest.mark.parametrize("kind,align", [("llama", False), ("qwen3", True), ("qwen3_moe", True)])
def test_in_the_learner_the_log_probs_and_gradients_of_sdpa_to_rounding(kind, align):
    from interq.quant import QuantConfig

    model = tiny_causal_lm(kind, num_layers=2).train()
    g = torch.Generator().manual_seed(0)
    lengths = [150, 97, 1]
    width = max(lengths)
    ids = torch.randint(0, 128, (len(lengths), width), generator=g)
    mask = (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).long()
    score = mask.bool() & (torch.rand(ids.shape, generator=g) < 0.3)
    res = {}
    for attention in ("sdpa", "kernel"):
        model.zero_grad(set_to_none=True)
        with learner_context(model, align, QuantConfig(), attention=attention):
            # the aligned learner wraps the implementation it finds (its K/V fake quantization, then that one)
            assert model.config._attn_implementation.endswith(NAME if attention == "kernel" else "sdpa")
            with torch.no_grad():
                proximal = sequence_logprobs(model, ids, mask, temperature=0.9, score_mask=score)
            lp = sequence_logprobs(model, ids, mask, temperature=0.9, score_mask=score)
            (-(lp * torch.linspace(-1, 1, 3)[:, None])[score].sum()).backward()
        assert model.config._attn_implementation == "sdpa"  # restored: an executor copied later gets sdpa
        assert torch.equal(proximal, lp.detach())  # the proximal pass and the training forward: the same bits
        res[attention] = (lp.detach(), torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None]))
    (lp_s, g_s), (lp_k, g_k) = res["sdpa"], res["kernel"]
    d = (lp_k - lp_s)[score].abs().max()
    # the aligned learner re-rounds activations to int8 codes: a rounding difference upstream can move a code
    assert float(d) < (2e-2 if align else 1e-5), float(d)
    rel = float((g_k - g_s).norm() / g_s.norm())
    assert rel < (2e-2 if align else 1e-4), rel
    assert float(F.cosine_similarity(g_k, g_s, dim=0)) > 0.9998


def test_the_executor_copied_inside_the_context_is_not_given_it():
    model = tiny_causal_lm("llama")
    with learner_attention(model, "kernel"):
        with learner_attention(model, "kernel"):  # nested: a no-op
            assert model.config._attn_implementation == NAME
        assert model.config._attn_implementation == NAME
    assert model.config._attn_implementation == "sdpa"
    assert copy.deepcopy(model).config._attn_implementation == "sdpa"
    eager = tiny_causal_lm("llama")
    eager.set_attn_implementation("eager")
    with pytest.raises(ValueError, match="needs a model with transformers' sdpa attention"):
        with learner_attention(eager, "kernel"):
            pass
    with pytest.raises(ValueError, match=r"train\.learner_attention='flash' is not accepted"):
        with learner_attention(model, "flash"):
            pass


def test_config_auto_resolves_to_the_kernel_where_it_loads_off_intel(monkeypatch):
    from interq import machine

    assert LEARNER_ATTENTIONS[1:] == MODULE_CHOICES
    monkeypatch.setattr(machine, "cpu_vendor", lambda: "AuthenticAMD")
    monkeypatch.setattr(machine, "cpu_has", lambda flag: False)  # neither AVX-512 nor AVX2 + FMA: the generic build
    assert build_config("q-interq", []).train.learner_attention == "sdpa"
    monkeypatch.setattr(machine, "cpu_has", lambda flag: flag == "avx2")  # AVX2 without FMA: the generic build too
    assert build_config("q-interq", []).train.learner_attention == "sdpa"
    monkeypatch.setattr(machine, "cpu_has", lambda flag: flag in ("avx2", "fma"))  # the AVX2 tiles: an opt-in
    assert build_config("q-interq", []).train.learner_attention == "sdpa"
    assert build_config("q-interq", ["train.learner_attention=kernel"]).train.learner_attention == "kernel"
    monkeypatch.setattr(machine, "cpu_has", lambda flag: flag == "avx512f")
    assert build_config("q-interq", []).train.learner_attention == "kernel"
    monkeypatch.setattr(machine, "cpu_vendor", lambda: "GenuineIntel")  # torch's flash kernel is faster there
    assert build_config("q-interq", []).train.learner_attention == "sdpa"
    assert build_config("q-interq", ["train.learner_attention=kernel"]).train.learner_attention == "kernel"
    monkeypatch.setattr(machine, "cpu_vendor", lambda: "AuthenticAMD")
    assert build_config("bf16", ["train.learner_attention=sdpa"]).train.learner_attention == "sdpa"
    assert resolve_learner_attention("auto", "cuda") == "sdpa"  # no GPU here: resolve_device refuses, sdpa
    with pytest.raises(ConfigError, match=r"train\.learner_attention='flash' is not accepted; choose one of "
                                          r"\['auto', 'sdpa', 'kernel'\]"):
        build_config("q-interq", ["train.learner_attention=flash"])
    monkeypatch.setattr(kernels, "load", lambda verbose=False: None)  # no compiler, or INTERQ_CPU_KERNELS=0
    assert build_config("q-interq", []).train.learner_attention == "sdpa"
    monkeypatch.setattr(kernels, "status", lambda: {"reason": "no compiler"})
    with pytest.raises(RuntimeError, match=r"choose train\.learner_attention='sdpa'"):
        with learner_attention(tiny_causal_lm("llama"), "kernel"):
            pass
