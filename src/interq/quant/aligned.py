"""The learner's aligned forward (quant-spec.md "Alignment").

``aligned(model, qcfg)`` is a **context manager**: inside it, ``model``'s forward runs the executor's
quantize-dequantize on weights (per sync: same scales, same fused groups), on activations (dynamic, per
token) and on K/V (after RoPE, per token and head, inside attention), each with a straight-through
estimator so gradients reach the high-precision master weights. The same ``QuantConfig`` fields drive both
sides, integer widths (``w_bits`` / ``a_bits`` / ``kv_bits``) included. On exit the model is restored; a graph
built inside can be back-propagated after exit.

    with aligned(learner, qcfg):
        logits = learner(input_ids=ids, attention_mask=mask).logits
    loss(logits).backward()

What it deliberately does NOT share with the executor: the GEMM is a float matmul of dequantized
operands in fp32 (the executor accumulates exactly in int32 / float64 and applies the CUTLASS epilogue),
and the whole sequence runs in one teacher-forced forward (the executor decodes token by token against its
quantized cache). Those are the real residuals InterQ corrects; they are not removed here.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, AttentionInterface

from interq.quant import primitives as P
from interq.quant.config import QuantConfig
from interq.quant.executor import fused_group, quantized_targets
from interq.quant.linear import check_experts_layout, experts_loop

_PREFIX = "interq_aligned_kv|"


def _aligned_attention(module: nn.Module, query, key, value, attention_mask, **kwargs):
    """Fake-quantize K (post-RoPE) and V per token and head, then run the model's own attention."""
    qcfg: QuantConfig = module.config._interq_kv_qcfg
    base = module.config._attn_implementation[len(_PREFIX):]
    key = P.fq_kv_ste(key, qcfg)  # [B, H_kv, T, D]
    value = P.fq_kv_ste(value, qcfg)  # [B, H_kv, T, D]
    if base == "eager":
        from transformers.models.llama.modeling_llama import eager_attention_forward as fn
    else:
        fn = ALL_ATTENTION_FUNCTIONS[base]
    return fn(module, query, key, value, attention_mask, **kwargs)


def _register(base: str) -> str:
    name = _PREFIX + base
    if name not in AttentionInterface._global_mapping:
        AttentionInterface.register(name, _aligned_attention)
        AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS[base])
    return name


def aligned_linear_forward(mod: nn.Linear, qcfg: QuantConfig, group: list[nn.Linear] | None, x: torch.Tensor):
    """y = fq(x) @ fq(W).T (+ b) in fp32, cast to x's dtype; STE to x and W."""
    amax = None
    if group is not None:  # fused per-tensor scale: max over q|k|v or gate|up
        amax = torch.stack([P.weight_amax(m.weight, qcfg) for m in group]).amax(0)  # [1, 1]
    w = P.fq_weight_ste(mod.weight, qcfg, amax)  # [N, K] fp32
    xq = P.fq_activation_ste(x, qcfg)  # [..., K] fp32
    y = nn.functional.linear(xq, w)  # [..., N] fp32
    if mod.bias is not None:
        y = y + mod.bias.to(x.dtype).float()
    return y.to(x.dtype)


def aligned_experts_forward(mod: nn.Module, qcfg: QuantConfig, hidden_states, top_k_index, top_k_weights):
    gu = P.fq_weight_ste(mod.gate_up_proj, qcfg)  # [E, 2I, H] fp32, per expert per output channel
    dn = P.fq_weight_ste(mod.down_proj, qcfg)  # [E, H, I] fp32

    def gemm(w):
        return lambda e, x: nn.functional.linear(P.fq_activation_ste(x, qcfg), w[e]).to(x.dtype)

    return experts_loop(hidden_states, top_k_index, top_k_weights, gu.shape[0], mod.act_fn, gemm(gu), gemm(dn))


@contextlib.contextmanager
def aligned(model: nn.Module, qcfg: QuantConfig):
    """Context manager: the learner's forward runs the executor's quantize-dequantize (see module doc)."""
    if not isinstance(qcfg, QuantConfig):
        raise TypeError(f"aligned: qcfg must be a QuantConfig, got {type(qcfg).__name__}")
    if getattr(model, "_interq_aligned", False):
        raise RuntimeError("aligned: the model is already inside an aligned() context")
    patched: list[nn.Module] = []
    cfg = model.config
    old_attn = cfg._attn_implementation
    model._interq_aligned = True
    try:
        if qcfg.quantizes_weights:
            linears, experts = quantized_targets(model, qcfg)
            groups: dict[str, list[nn.Linear]] = {}
            if qcfg.w_granularity == "tensor":
                for n, m in linears.items():
                    groups.setdefault(fused_group(n), []).append(m)
            for n, m in linears.items():
                grp = groups.get(fused_group(n)) if groups else None
                m.forward = (lambda m, grp: lambda x: aligned_linear_forward(m, qcfg, grp, x))(m, grp)
                patched.append(m)
            for m in experts.values():
                check_experts_layout(m)
                m.forward = (lambda m: lambda h, i, w: aligned_experts_forward(m, qcfg, h, i, w))(m)
                patched.append(m)
        if qcfg.quantizes_kv:
            if old_attn not in ("sdpa", "eager"):
                raise NotImplementedError(f"aligned: attention implementation {old_attn!r} is not supported "
                                          "(accepted: 'sdpa', 'eager')")
            cfg._interq_kv_qcfg = qcfg
            cfg._attn_implementation = _register(old_attn)
        yield model
    finally:
        for m in patched:
            del m.forward
        cfg._attn_implementation = old_attn
        if hasattr(cfg, "_interq_kv_qcfg"):
            del cfg._interq_kv_qcfg
        model._interq_aligned = False
