"""train.learner_gemm=onednn: the learner's fp32 linear layers through oneDNN instead of torch's BLAS.

The same fp32 arithmetic summed in another order: every GEMM within fp32 rounding of the float64 closed form (forward,
grad_x, grad_W, bias), log-probs and gradients within rounding of learner_gemm=torch; the no-grad pass (proximal) and
the graph-building pass (current) give the same bits; with bf16_backward its forward runs here.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from interq.quant import QuantConfig
from interq.quant.testing import tiny_causal_lm
from interq.train import onednn_gemm as O
from interq.train.bf16_backward import bf16_backward
from interq.train.config import ConfigError, build_config
from interq.train.onednn_gemm import OneDnnLinear, linear_fp32, onednn_gemm
from interq.train.rl import Learner, _sequence_logprobs, enable_activation_checkpointing, learner_context
from test_train_learner_autocast import _micro_batch

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch without oneDNN")


def _operands(bias: bool = True, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(3, 7, 40, generator=g).requires_grad_()  # [B, T, K]
    w = torch.randn(12, 40, generator=g).requires_grad_()  # [N, K]
    b = torch.randn(12, generator=g).requires_grad_() if bias else None  # [N]
    gy = torch.randn(3, 7, 12, generator=g)  # [B, T, N]
    return x, w, b, gy


def _rel(got: torch.Tensor, ref: torch.Tensor) -> float:
    return float((got.detach().double() - ref).norm() / ref.norm())


@pytest.mark.parametrize("bias", [True, False])
def test_every_gemm_is_the_closed_form_within_fp32_rounding(bias):
    x, w, b, gy = _operands(bias)
    y = OneDnnLinear.apply(x, w, b)
    xd, wd = x.detach().double(), w.detach().double()
    y_ref = xd @ wd.t() + (b.detach().double() if bias else 0)  # [B, T, N]
    assert y.dtype == torch.float32 and 0 <= _rel(y, y_ref) < 1e-6
    assert torch.equal(y, linear_fp32(x.detach(), w.detach(), None if b is None else b.detach()))
    y.backward(gy)
    gyd = gy.double()
    assert 0 < _rel(x.grad, gyd @ wd) < 1e-6  # grad_x = grad_y W: a transposition or sign error is O(1)
    assert 0 < _rel(w.grad, gyd.reshape(-1, 12).t() @ xd.reshape(-1, 40)) < 1e-6  # grad_W = grad_y^T x
    if bias:
        assert _rel(b.grad, gyd.reshape(-1, 12).sum(0)) < 1e-6


def test_the_context_takes_fp32_cpu_linears_with_and_without_grad_and_restores_f_linear():
    x, w, b, _ = _operands()
    with onednn_gemm():
        y = F.linear(x, w, b)
        y_module = torch.nn.Linear(40, 12)(x)
        with torch.no_grad():
            y_nograd = F.linear(x, w, b)
        y_bf16 = F.linear(x.detach().bfloat16(), w.detach().bfloat16())
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y_auto = F.linear(x, w, b)
    assert "OneDnnLinear" in type(y.grad_fn).__name__ and "OneDnnLinear" in type(y_module.grad_fn).__name__
    assert torch.equal(y_nograd, y)  # the proximal pass computes what the training forward computes
    assert torch.equal(y_nograd, linear_fp32(x.detach(), w.detach(), b.detach()))
    assert y_bf16.dtype == torch.bfloat16 and y_auto.dtype == torch.bfloat16  # left to torch (and to autocast)
    assert F.linear is torch._C._nn.linear and O._SWAP.depth == 0


def test_inside_bf16_backward_the_forward_runs_here_and_the_backward_in_bf16():
    x, w, b, gy = _operands()
    with onednn_gemm(), bf16_backward():
        y = F.linear(x, w, b)
        with torch.no_grad():
            y_nograd = F.linear(x, w, b)
    assert "Bf16BackwardLinear" in type(y.grad_fn).__name__
    assert torch.equal(y, linear_fp32(x.detach(), w.detach(), b.detach())) and torch.equal(y_nograd, y)
    assert F.linear is torch._C._nn.linear
    y.backward(gy)
    g16, x16 = gy.reshape(-1, 12).bfloat16(), x.detach().reshape(-1, 40).bfloat16()
    assert torch.equal(w.grad, (g16.t() @ x16).float())


def _grad(model, align, gemm, autocast="off", checkpointing=False):
    qcfg = QuantConfig() if align else None
    enable_activation_checkpointing(model, checkpointing)
    model.train()
    model.zero_grad(set_to_none=True)
    mb, batch = _micro_batch(1)
    adv = torch.linspace(-1, 1, mb["input_ids"].shape[0])[:, None]  # [B, 1]
    with learner_context(model, align, qcfg, autocast, gemm):  # the backward inside, as rl.update runs it
        lp = _sequence_logprobs(model, mb, batch)  # [B, L]
        (-(lp * adv)[mb["action_mask"]].sum()).backward()
        with torch.no_grad():
            lp_nograd = _sequence_logprobs(model, mb, batch)
    g = torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None]).double()  # [P]
    return lp.detach(), lp_nograd, g


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
@pytest.mark.parametrize("align", [False, True], ids=["plain", "aligned"])
def test_learner_log_probs_and_gradients_are_the_fp32_ones_within_rounding(kind, align):
    model = tiny_causal_lm(kind)
    lp_t, _, g_t = _grad(model, align, "torch")
    lp_o, lp_o_nograd, g_o = _grad(model, align, "onednn")
    assert torch.equal(lp_o, lp_o_nograd)  # proximal == current, bit for bit
    assert float((lp_o - lp_t).abs().max()) < 1e-4
    rel = float((g_o - g_t).norm() / g_t.norm())
    assert rel < 1e-4, f"gradient relative L2 difference {rel:.2e}"
    assert float(F.cosine_similarity(g_o, g_t, dim=0)) > 0.99999


def test_with_gradient_checkpointing_and_bf16_backward():
    model = tiny_causal_lm("qwen3", num_layers=3)
    _, _, kept = _grad(model, True, "onednn")
    _, _, recomputed = _grad(model, True, "onednn", checkpointing=True)
    torch.testing.assert_close(recomputed, kept, rtol=1e-5, atol=1e-7)
    lp16, _, g16 = _grad(model, True, "onednn", "bf16_backward")
    lp32, _, g32 = _grad(model, True, "onednn")
    assert torch.equal(lp16, lp32)  # bf16_backward keeps the forward: here oneDNN's
    assert float(F.cosine_similarity(g16, g32, dim=0)) > 0.999


def test_config_field_reaches_the_learner_and_is_validated():
    cfg = build_config("q-interq", ["train.learner_gemm=onednn", "train.learner_autocast=bf16_backward"])
    assert cfg.train.learner_gemm == "onednn" and build_config("q-interq", []).train.learner_gemm == "torch"
    learner = Learner(tiny_causal_lm("llama"), cfg, QuantConfig())
    with learner.context():
        assert F.linear is not torch._C._nn.linear and O._SWAP.depth == 1
    assert F.linear is torch._C._nn.linear and O._SWAP.depth == 0
    with pytest.raises(ConfigError, match=r"train.learner_gemm.*choose one of \['torch', 'onednn'\]"):
        build_config("q-interq", ["train.learner_gemm=mkl"])
    with pytest.raises(ConfigError, match=r"not accepted with train.learner_autocast='bf16'"):
        build_config("bf16", ["train.learner_gemm=onednn", "train.learner_autocast=bf16"])
