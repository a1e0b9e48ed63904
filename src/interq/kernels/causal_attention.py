"""The learner's causal self-attention by interq's CPU kernel: the attention function that
``train.learner_attention=kernel`` registers with transformers (:mod:`interq.train.learner_attention` sets it on a
learner for the duration; :mod:`interq.quant.aligned` wraps it where it fake-quantizes the keys and values).

The learner's rows are right-padded and attend causally without a mask (NUMERICS_VERSION 3), so every attention call
of its forward is one causal problem per row and head, fp32: transformers' ``sdpa`` hands it to torch's CPU flash
kernel, whose forward and backward ran at about 60-65 GFLOP/s on one Zen 5 core, a third of the learner's time
on SmolLM2 rows of 1,760 tokens. ``causal_attention_fwd`` /
``causal_attention_bwd`` (``interq.kernels``) compute the same function with FlashAttention-2's blocking and
register-tiled block products: an fp32 computation of its own, to rounding, not the same bits as torch's kernel.

A call goes to the kernel when it is a causal self-attention without a mask in fp32 on the CPU (no dropout,
soft-capping, position bias or sliding window, head size a multiple of 16 up to 256); any other call is
transformers' ``sdpa``. The proximal pass and the training forward run the same kernel, so their log-probs are the
same bits. It sits beside the executor (not in :mod:`interq.train`) because the aligned forward, which the executor
layer owns, needs its name and function.
"""

from __future__ import annotations

import torch

NAME = "interq_learner_kernel"


class CausalAttention(torch.autograd.Function):
    """q [B, H, L, D], k / v [B, H_kv, L, D] (float32, CPU) -> softmax(q k^T * scale, causal) v as [B, L, H, D]."""

    @staticmethod
    def forward(ctx, q, k, v, scale: float):
        mod = require_kernels()
        q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
        out, lse = mod.causal_attention_fwd(q, k, v, float(scale))  # [B, L, H, D], [B, H, L]
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.scale = float(scale)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = require_kernels().causal_attention_bwd(q, k, v, out, lse, dout.contiguous(), ctx.scale)
        return dq, dk, dv, None


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """Causal GQA self-attention by the kernel, differentiable: q [B, H, L, D], k / v [B, H_kv, L, D] -> [B, L, H, D].
    ``scale`` defaults to ``D ** -0.5``."""
    return CausalAttention.apply(q, k, v, q.shape[-1] ** -0.5 if scale is None else scale)


def require_kernels():
    from interq import kernels

    mod = kernels.load()
    if mod is None:
        raise RuntimeError("train.learner_attention='kernel' needs interq's CPU kernels, which are not available here "
                           f"({kernels.status().get('reason')}); choose train.learner_attention='sdpa'")
    return mod


def takes(module, query, key, value, attention_mask, dropout, kwargs) -> bool:
    """Whether the kernel computes this call (see the module docstring); else transformers' ``sdpa`` does."""
    h, hkv, d = query.shape[1], key.shape[1], query.shape[-1]
    return (attention_mask is None and query.shape[2] == key.shape[2] and getattr(module, "is_causal", True)
            and kwargs.get("is_causal", True) is not False and not dropout
            and kwargs.get("softcap") is None and kwargs.get("position_bias") is None
            and kwargs.get("sliding_window") is None
            and query.device.type == "cpu" and query.dtype == key.dtype == value.dtype == torch.float32
            and d % 16 == 0 and d <= 256 and value.shape[-1] == d and hkv >= 1 and h % hkv == 0)


def kernel_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
    """transformers' attention-function signature: query [B, H, L, D], key/value [B, H_kv, L, D]
    -> ([B, L, H, D], None)."""
    if not takes(module, query, key, value, attention_mask, dropout, kwargs):
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    return causal_attention(query, key, value, scaling), None


def register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, kernel_attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)  # masks as sdpa makes them (None for the learner's rows)
