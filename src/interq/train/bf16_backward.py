"""The learner's linear layers with an fp32 forward and a bf16 backward (``train.learner_autocast=bf16_backward``).

Inside :func:`bf16_backward`, every ``torch.nn.functional.linear`` call that builds a graph (an input or the weight
requires grad; fp32 operands) runs as :class:`Bf16BackwardLinear`: the forward is ``F.linear`` itself, so
log-probs, ratios and corrections are the fp32 ones bit for bit; the backward computes its two GEMMs from bf16
copies of the operands (``grad_x = grad_y @ W``, ``grad_W = grad_y^T @ x``; the bias gradient stays an fp32 sum)
and hands fp32 gradients back. The input is saved for the backward as bf16 (half the memory of an fp32 copy; one
copy for the projections that read the same input).

Why: the GEMMs are about 70% of a SmolLM2 learner pass on CPU (``aten::mm`` in a profile of the aligned
learner, 832 tokens), two thirds of them in the backward, and a bf16 GEMM runs about 2.9x an fp32 one where bf16
is native (AVX512_BF16 / AMX CPUs; tensor cores). Unlike ``train.learner_autocast=bf16`` it applies to the
aligned learner too: nothing upstream of the aligned forward's activation quantization changes, so its int8 codes
are those of the fp32 forward. What it costs: each gradient GEMM rounds to bf16 (8 significant bits), measured in
``tests/test_train_bf16_backward.py`` and docs/performance.md "Learner".

Where bf16 is not native (an AVX2 or AVX-512 CPU without AVX512_BF16/AMX, a GPU before compute capability 8.0), the
two GEMMs are computed as fp32 GEMMs of the bf16-rounded operands, rounded back to bf16 (:func:`bf16_mm`): the same
quantities (exact bf16 products, fp32 sums, a bf16 result) up to the order of the sums, which differs between any two
GEMM kernels. torch's own bf16 GEMM on such a CPU is 25-40x slower than the fp32 one at the study's shapes.

Attention, norms and the other element-wise backward ops keep fp32; only ``F.linear`` calls are taken (the
decoder's projections, the lm-head, the aligned learner's fake-quantized GEMMs and MoE experts' loops).
"""

from __future__ import annotations

import contextlib
import weakref

import torch

from interq.train import onednn_gemm
from interq.train.linear_swap import LinearSwap

_NATIVE: dict = {}  # device type -> bf16 GEMMs run in hardware there (read once per process)
_LAST_X16: list = [None]  # (weakref to x, x's version, bf16 copy): the last input converted


def _bf16_input(x: torch.Tensor) -> torch.Tensor:
    """``x`` in bf16, converted once for the projections that read the same input one after the other (q|k|v,
    gate|up): one saved copy instead of one per projection. Keyed on ``x`` itself and its version counter (a write
    through ``x.data`` would not be seen; cleared when :func:`bf16_backward` exits)."""
    last = _LAST_X16[0]
    if last is not None and last[0]() is x and last[1] == x._version:
        return last[2]
    x16 = x.detach().to(torch.bfloat16)
    _LAST_X16[0] = (weakref.ref(x), x._version, x16)
    return x16


def bf16_mm(a: torch.Tensor, b: torch.Tensor, native: bool | None = None) -> torch.Tensor:
    """``a @ b`` of two bf16 matrices [M, K] @ [K, N] -> bf16 [M, N]: exact products, fp32 sums, one rounding to bf16.

    ``native`` (default: whether bf16 is native on ``a``'s device, :func:`interq.machine.bf16_native`): torch's bf16
    GEMM; otherwise the fp32 GEMM of the operands (each bf16 value is exact in fp32, and so is the product of two)
    rounded to bf16 once. The two agree up to the order of the fp32 sums."""
    if native is None:
        kind = a.device.type
        if kind not in _NATIVE:
            from interq.machine import bf16_native
            _NATIVE[kind] = bf16_native(a.device)
        native = _NATIVE[kind]
    if native:
        return a @ b
    return (a.float() @ b.float()).to(torch.bfloat16)


class Bf16BackwardLinear(torch.autograd.Function):
    """``F.linear(x, w, b)`` forward; backward GEMMs in bf16, gradients in the operands' dtypes.
    x [..., K], w [N, K], b [N] or None -> [..., N]."""

    @staticmethod
    def forward(ctx, x, w, b):
        ctx.save_for_backward(_bf16_input(x) if ctx.needs_input_grad[1] else None, w)  # x only for grad_W
        ctx.x_dtype, ctx.has_bias = x.dtype, b is not None
        return _forward(x, w, b)

    @staticmethod
    def backward(ctx, grad_y):
        x16, w = ctx.saved_tensors
        n, k = w.shape
        g16 = grad_y.reshape(-1, n).to(torch.bfloat16)  # [M, N]
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = bf16_mm(g16, w.to(torch.bfloat16)).to(ctx.x_dtype).reshape(*grad_y.shape[:-1], k)  # [..., K]
        if ctx.needs_input_grad[1]:
            grad_w = bf16_mm(g16.t(), x16.reshape(-1, k)).to(w.dtype)  # [N, K]
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = grad_y.reshape(-1, n).sum(0)  # [N], fp32
        return grad_x, grad_w, grad_b


def _takes(x, w, b) -> bool:
    tensors = [t for t in (x, w, b) if t is not None]
    return (torch.is_grad_enabled() and any(t.requires_grad for t in tensors)
            and all(t.dtype == torch.float32 for t in tensors) and w.dim() == 2)


def _forward(x, w, b):
    """The fp32 forward: ``F.linear`` itself, or oneDNN's inside ``interq.train.onednn_gemm`` (``learner_gemm``)."""
    return onednn_gemm._linear(x, w, b)  # F.linear itself unless that context is open


def _linear(input, weight, bias=None):  # noqa: A002 (F.linear's own argument names)
    if _takes(input, weight, bias):
        return Bf16BackwardLinear.apply(input, weight, bias)
    return _forward(input, weight, bias)


@contextlib.contextmanager
def bf16_backward():
    """Every graph-building fp32 ``torch.nn.functional.linear`` inside runs as :class:`Bf16BackwardLinear`.

    The function is swapped process-wide for the duration (not a ``TorchFunctionMode``: modes are thread-local and
    the autograd engine does not carry them into the backward, where activation checkpointing recomputes the
    forward). Calls under ``no_grad`` / ``inference_mode`` (a rollout executor) are not taken. The backward of a graph
    built inside may run after exit (the Function is recorded in the graph); a checkpointed forward must be
    recomputed inside, as the learner's backward is (``interq.train.rl.update``; outside, torch's checkpoint
    check raises)."""
    with _SWAP:
        try:
            yield
        finally:
            if _SWAP.depth == 1:  # the outermost closes
                _LAST_X16[0] = None


_SWAP = LinearSwap(_linear)
