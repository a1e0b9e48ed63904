"""The learner's fp32 linear layers through oneDNN instead of torch's BLAS (``train.learner_gemm=onednn``).

Inside :func:`onednn_gemm`, every fp32 ``torch.nn.functional.linear`` call on the CPU (graph-building or not, so the
proximal pass and the training forward compute the same log-probs) runs its GEMMs through oneDNN
(``torch.ops.mkldnn._linear_pointwise``): the forward ``y = x W^T + b`` and, in :class:`OneDnnLinear`'s backward,
``grad_x = grad_y W`` and ``grad_W = grad_y^T x`` (the bias gradient an fp32 sum, as torch's).

Why: torch's fp32 GEMMs go to MKL, which on an AMD Zen 5 EPYC runs at less than half oneDNN's rate (MKL's code path
for AMD CPUs; ``MKL_ENABLE_INSTRUCTIONS=AVX512`` did not change it), while oneDNN picks its kernels by the CPU's
instruction set: 1 thread, the learner's shapes (3,048 tokens x 576 -> 1,536 and back), MKL 78-95 GFLOP/s, oneDNN
176-206 (``results/benchmarks/zen5-avx512-vnni/2026-12-02-kv-append-onednn/fp32_gemm_paths.log``). Not measured on Intel CPUs. Both are IEEE fp32
GEMMs; they sum in another order, so the log-probs and gradients differ from ``learner_gemm=torch`` by float
rounding (about 1e-6 relative for these shapes, against 3e-7 for MKL, measured against float64): an opt-in, not the
default, so that runs stay comparable with the study's. With ``train.learner_autocast=bf16_backward`` the forward
runs here and the backward GEMMs in bf16 as before (torch's bf16 GEMMs are oneDNN's already).

Not taken: calls under ``torch.autocast`` (autocast decides their dtype), non-fp32 or non-CPU operands, weights
that are not 2-D; those run ``F.linear`` itself.
"""

from __future__ import annotations

import contextlib

import torch

from interq.train.linear_swap import F_LINEAR, LinearSwap


def _mm_t(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``a @ b^T (+ bias)`` through oneDNN: a [M, K], b [N, K] (any strides) -> [M, N] fp32."""
    return torch.ops.mkldnn._linear_pointwise(a, b, bias, "none", [], "")


def linear_fp32(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, w, b)`` computed by oneDNN, no autograd. x [..., K], w [N, K], b [N] or None -> [..., N]."""
    return _mm_t(x.reshape(-1, x.shape[-1]), w, b).reshape(*x.shape[:-1], w.shape[0])


class OneDnnLinear(torch.autograd.Function):
    """``F.linear(x, w, b)`` with every GEMM, forward and backward, through oneDNN."""

    @staticmethod
    def forward(ctx, x, w, b):
        ctx.save_for_backward(x if ctx.needs_input_grad[1] else None, w)
        ctx.has_bias = b is not None
        return linear_fp32(x, w, b)

    @staticmethod
    def backward(ctx, grad_y):
        x, w = ctx.saved_tensors
        n, k = w.shape
        g = grad_y.reshape(-1, n)  # [M, N]
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = _mm_t(g, w.t()).reshape(*grad_y.shape[:-1], k)  # [..., K] = grad_y W
        if ctx.needs_input_grad[1]:
            grad_w = _mm_t(g.t(), x.reshape(-1, k).t())  # [N, K] = grad_y^T x
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = g.sum(0)  # [N]
        return grad_x, grad_w, grad_b


def takes(x, w, b) -> bool:
    """An fp32 CPU linear with a 2-D weight, outside autocast: what :func:`onednn_gemm` runs through oneDNN."""
    if _SWAP.depth == 0:  # the context is not open: every F.linear of bf16_backward's forward comes here first
        return False
    tensors = [t for t in (x, w, b) if t is not None]
    return (w.dim() == 2 and not torch.is_autocast_enabled("cpu")
            and all(t.dtype == torch.float32 and t.device.type == "cpu" for t in tensors))


def _linear(input, weight, bias=None):  # noqa: A002 (F.linear's own argument names)
    if not takes(input, weight, bias):
        return F_LINEAR(input, weight, bias)
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (input, weight, bias)):
        return OneDnnLinear.apply(input, weight, bias)
    return linear_fp32(input, weight, bias)


@contextlib.contextmanager
def onednn_gemm():
    """Every fp32 CPU ``torch.nn.functional.linear`` inside runs through oneDNN (module docstring). Swapped
    process-wide for the duration, as :func:`interq.train.bf16_backward.bf16_backward` does; inside that context
    its forward runs here too. A backward recorded inside may run after exit (the Function is in the graph)."""
    if not torch.backends.mkldnn.is_available():
        raise RuntimeError("train.learner_gemm='onednn' needs torch built with oneDNN (torch.backends.mkldnn); "
                           "choose train.learner_gemm='torch'")
    with _SWAP:
        yield


_SWAP = LinearSwap(_linear)
