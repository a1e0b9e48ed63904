"""train.learner_autocast=bf16_backward: fp32 forward, the linear layers' backward GEMMs in bf16.

The forward is the fp32 one bit for bit (plain and aligned learner), so log-probs, ratios and corrections do not
move; the gradient is the fp32 gradient up to bf16 rounding of the GEMMs: within 2% (relative L2), cosine > 0.999
on tiny policies, and exactly the bf16 GEMMs of bf16 copies of the operands.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from interq.quant import QuantConfig
from interq.quant.testing import tiny_causal_lm
from interq.train.bf16_backward import Bf16BackwardLinear, bf16_backward, bf16_mm
from interq.train.config import ConfigError, build_config
from interq.train.rl import _sequence_logprobs, enable_activation_checkpointing, learner_context
from test_train_learner_autocast import COSINE_MIN, GRAD_REL_L2_TOL, _micro_batch


def _operands(bias: bool = True, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(3, 7, 24, generator=g, dtype=torch.float64).float().requires_grad_()  # [B, T, K]
    w = torch.randn(10, 24, generator=g).requires_grad_()  # [N, K]
    b = torch.randn(10, generator=g).requires_grad_() if bias else None  # [N]
    gy = torch.randn(3, 7, 10, generator=g)  # [B, T, N]
    return x, w, b, gy


@pytest.mark.parametrize("bias", [True, False])
def test_function_forward_is_f_linear_and_backward_is_the_bf16_gemms(bias):
    x, w, b, gy = _operands(bias)
    y = Bf16BackwardLinear.apply(x, w, b)
    assert torch.equal(y, F.linear(x, w, b))
    y.backward(gy)
    g16, x16, w16 = gy.reshape(-1, 10).bfloat16(), x.detach().reshape(-1, 24).bfloat16(), w.detach().bfloat16()
    assert x.grad.dtype == w.grad.dtype == torch.float32
    assert torch.equal(x.grad, bf16_mm(g16, w16).float().reshape(3, 7, 24))
    assert torch.equal(w.grad, bf16_mm(g16.t(), x16).float())
    if bias:
        torch.testing.assert_close(b.grad, gy.reshape(-1, 10).sum(0), rtol=0, atol=0)
    # and the closed form, in float64: within bf16 rounding, far from a sign error or a transposition
    gx_ref = gy.double() @ w.detach().double()  # [B, T, K]
    gw_ref = gy.reshape(-1, 10).double().t() @ x.detach().reshape(-1, 24).double()  # [N, K]
    for got, ref in ((x.grad, gx_ref), (w.grad, gw_ref)):
        rel = float((got.double() - ref).norm() / ref.norm())
        assert 0 < rel < 1e-2, rel


@pytest.mark.parametrize("native", [True, False])
def test_bf16_mm_is_the_exact_product_sum_rounded_once_to_bf16(native):
    # both ways of computing it (torch's bf16 GEMM, the fp32 GEMM of the operands) against the float64 closed form:
    # within one bf16 ulp of each entry plus the worst-case error of K fp32 additions (the sums' order is the
    # kernel's, so an entry near 0 may lose more than an ulp of itself on another CPU), and shape and dtype as a GEMM's
    g = torch.Generator().manual_seed(1)
    a = torch.randn(37, 200, generator=g).bfloat16()  # [M, K]
    b = torch.randn(200, 19, generator=g).bfloat16()  # [K, N]
    got = bf16_mm(a, b, native=native)
    assert got.dtype == torch.bfloat16 and got.shape == (37, 19)
    ref = a.double() @ b.double()  # exact up to float64 rounding
    ulp = torch.finfo(torch.bfloat16).eps * ref.abs()  # one bf16 ulp at or above each entry's size
    sums = a.shape[1] * torch.finfo(torch.float32).eps / 2 * (a.double().abs() @ b.double().abs())  # K fp32 adds
    assert ((got.double() - ref).abs() <= ulp + sums).all()


def test_the_context_takes_graph_building_fp32_linears_only_and_restores_f_linear():
    x, w, b, _ = _operands()
    with bf16_backward():
        y = F.linear(x, w, b)
        y_module = torch.nn.Linear(24, 10)(x)
        y_kw = F.linear(input=x, weight=w, bias=b)
        with torch.no_grad():
            y_nograd = F.linear(x, w, b)
        y_frozen = F.linear(x.detach(), w.detach())
        y_bf16 = F.linear(x.detach().bfloat16().requires_grad_(), w.detach().bfloat16())
    assert "Bf16BackwardLinear" in type(y.grad_fn).__name__
    assert "Bf16BackwardLinear" in type(y_module.grad_fn).__name__
    assert "Bf16BackwardLinear" in type(y_kw.grad_fn).__name__ and torch.equal(y_kw, y)
    assert y_nograd.grad_fn is None and y_frozen.grad_fn is None
    assert "Bf16BackwardLinear" not in type(y_bf16.grad_fn).__name__  # already bf16: left to autograd
    assert F.linear is torch._C._nn.linear and "Bf16BackwardLinear" not in type(F.linear(x, w).grad_fn).__name__


def test_projections_of_one_input_share_one_bf16_copy():
    """q|k|v (gate|up) read the same input: one bf16 copy is saved for all of them, a new one once the input changed."""
    x, w, _, gy = _operands(bias=False)
    h = x * 1  # a non-leaf input, as a decoder's hidden states
    with bf16_backward():
        ya, yb = F.linear(h, w), F.linear(h, w * 2)
        h.mul_(1)  # in place: a new version of the input
        yc = F.linear(h, w)
    saved = [y.grad_fn.saved_tensors[0] for y in (ya, yb, yc)]
    assert saved[0].data_ptr() == saved[1].data_ptr() != saved[2].data_ptr()
    assert all(torch.equal(t, x.detach().bfloat16()) for t in saved)
    (ya + yb).backward(gy)  # the gradients are those of separate copies
    g16, x16, w16 = gy.reshape(-1, 10).bfloat16(), x.detach().reshape(-1, 24).bfloat16(), w.detach().bfloat16()
    torch.testing.assert_close(x.grad, (g16 @ w16).float().reshape(3, 7, 24) * 3, rtol=1e-2, atol=1e-3)
    torch.testing.assert_close(w.grad, (g16.t() @ x16).float() * 3, rtol=1e-2, atol=1e-3)  # from the shared copy
    with bf16_backward():
        with torch.no_grad():
            F.linear(h, w)
        assert F.linear(h, w).grad_fn is not None
    from interq.train.bf16_backward import _LAST_X16

    assert _LAST_X16[0] is None  # dropped on exit


def _grad(model, align, autocast, checkpointing=False):
    qcfg = QuantConfig() if align else None
    enable_activation_checkpointing(model, checkpointing)
    model.train()
    model.zero_grad(set_to_none=True)
    mb, batch = _micro_batch(1)
    adv = torch.linspace(-1, 1, mb["input_ids"].shape[0])[:, None]  # [B, 1]: every row's gradient matters
    with learner_context(model, align, qcfg, autocast):  # the backward inside, as rl.update runs it
        lp = _sequence_logprobs(model, mb, batch)  # [B, L]
        (-(lp * adv)[mb["action_mask"]].sum()).backward()
    g = torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None]).double()  # [P]
    return lp.detach(), g


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
@pytest.mark.parametrize("align", [False, True], ids=["plain", "aligned"])
def test_log_probs_are_the_fp32_ones_and_the_gradient_is_close(kind, align):
    model = tiny_causal_lm(kind)
    lp32, g32 = _grad(model, align, "off")
    lp16, g16 = _grad(model, align, "bf16_backward")
    assert torch.equal(lp16, lp32), "the forward must be the fp32 forward bit for bit"
    rel = float((g16 - g32).norm() / g32.norm())
    cos = float(F.cosine_similarity(g16, g32, dim=0))
    assert 0 < rel < GRAD_REL_L2_TOL, f"bf16-backward gradient relative L2 error {rel:.4f} (tolerance {GRAD_REL_L2_TOL})"
    assert cos > COSINE_MIN, f"gradient cosine {cos:.6f}"


@pytest.mark.parametrize("align", [False, True], ids=["plain", "aligned"])
def test_with_gradient_checkpointing_the_same_gradient(align):
    model = tiny_causal_lm("qwen3", num_layers=3)
    _, kept = _grad(model, align, "bf16_backward")
    _, recomputed = _grad(model, align, "bf16_backward", checkpointing=True)
    torch.testing.assert_close(recomputed, kept, rtol=1e-5, atol=1e-7)


def test_accepted_with_the_aligned_learner_and_validated():
    assert build_config("q-interq", ["train.learner_autocast=bf16_backward"]).train.learner_autocast == "bf16_backward"
    assert build_config("bf16", ["train.learner_autocast=bf16_backward"]).train.learner_autocast == "bf16_backward"
    with pytest.raises(ConfigError, match=r"choose one of \['auto', 'off', 'bf16', 'bf16_backward'\]"):
        build_config("q-interq", ["train.learner_autocast=bf16_grad"])
    with pytest.raises(ConfigError, match=r"choose train\.learner_autocast='off' or 'bf16_backward'"):
        build_config("q-align", ["train.learner_autocast=bf16"])
