"""The learner's aligned forward (docs/executor.md, "Alignment").

``aligned(model, qcfg)`` is a **context manager**: inside it, ``model``'s forward runs the executor's
quantize-dequantize on weights (per sync: same scales, same fused groups), on activations (dynamic, per
token) and on K/V (after RoPE, per token and head, inside attention), each with a straight-through
estimator so gradients reach the high-precision master weights. The same ``QuantConfig`` fields drive both
sides, integer widths (``w_bits`` / ``a_bits`` / ``kv_bits``) included. On exit the model is restored; a graph
built inside can be back-propagated after exit.

    with aligned(learner, qcfg):
        logits = learner(input_ids=ids, attention_mask=mask).logits
    loss(logits).backward()

The fake-quantized weights are computed once per weight version, not on every forward (``cache_weights=True``,
the default): each quantized module's dequantized weight is kept, keyed on its parameters' identity and version
counters (and the group's, for a shared per-tensor scale), so the forwards of one optimizer step (proximal pass,
micro-batches) reuse it and the first forward after ``optimizer.step()`` (an in-place update: new versions)
recomputes it. Values and gradients are bit for bit those of the uncached path: the kept value is the STE's own
forward value ``fq(w) + (w - w)``, and the gradient reaches ``w`` unchanged, as through the STE. The cache holds
one fp32 copy of the quantized weights per model (outside the model: a deep copy does not carry it; freed with
the model or by :func:`clear_aligned_cache`). A write through ``param.data`` does not bump the version counter:
after one, call :func:`clear_aligned_cache` (torch optimizers, ``load_state_dict`` and ``copy_`` under no_grad
all bump it).

What it deliberately does NOT share with the executor: the GEMM is a float matmul of dequantized
operands in fp32 (the executor accumulates exactly in int32 / float64 and applies the CUTLASS epilogue),
and the whole sequence runs in one teacher-forced forward (the executor decodes token by token against its
quantized cache). Those are the real residuals InterQ corrects; they are not removed here.
"""

from __future__ import annotations

import contextlib
import weakref

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


# module -> {parameter name: (key, fake-quantized value)}; weak keys: dies with the module, not deep-copied
_FQ_CACHE: "weakref.WeakKeyDictionary[nn.Module, dict]" = weakref.WeakKeyDictionary()


def _weight_key(qcfg: QuantConfig, tensors) -> tuple:
    return (qcfg, *((t.data_ptr(), t._version, t.dtype, t.device, tuple(t.shape)) for t in tensors))


class _CachedSTE(torch.autograd.Function):
    """Forward: the kept fake-quantized value (a view of it); backward: the gradient to ``w`` unchanged (cast to
    its dtype), as the straight-through ``fq.detach() + (w - w.detach())`` gives."""

    @staticmethod
    def forward(ctx, w, value):
        ctx.w_dtype = w.dtype
        return value.view_as(value)

    @staticmethod
    def backward(ctx, grad):
        return grad.to(ctx.w_dtype), None


def fq_weight_ste_cached(mod: nn.Module, name: str, w: torch.Tensor, qcfg: QuantConfig, amax_fn=None,
                         depends_on=()) -> torch.Tensor:
    """``P.fq_weight_ste(w, qcfg, amax_fn())`` (same value, same gradient), computed once per version of ``w``
    (and of ``depends_on``, the tensors the amax reads) and kept for ``mod`` under ``name``."""
    store = _FQ_CACHE.setdefault(mod, {})
    key = _weight_key(qcfg, (w, *depends_on))
    hit = store.get(name)
    if hit is None or hit[0] != key:
        with torch.no_grad():
            wd = w.detach()
            value = P.fake_quant_weight(wd, qcfg, None if amax_fn is None else amax_fn()) + (wd - wd)  # STE value
        store[name] = hit = (key, value)
    return _CachedSTE.apply(w, hit[1])


def clear_aligned_cache(model: nn.Module) -> None:
    """Drop the fake-quantized weights kept for ``model``'s modules (see the module docstring)."""
    for m in model.modules():
        _FQ_CACHE.pop(m, None)


_LAST_XQ: list = [None]  # (weakref to x, (version, grad mode, requires_grad, qcfg), fq(x)): the last one quantized


def _shared_fq_activation(x: torch.Tensor, qcfg: QuantConfig) -> torch.Tensor:
    """``P.fq_activation_ste(x, qcfg)``, computed once for the projections that read the same input one after the other
    (q|k|v, gate|up: as the executor quantizes a fused input once). The same value; the STE gradients of the
    projections meet at the shared node instead of at ``x`` (the same sum, in another order). Keyed on ``x``
    itself and its version counter: a write through ``x.data`` between two projections would not be seen (no
    caller does that; cleared when :func:`aligned` exits)."""
    if x.is_inference():  # no version counter to key on
        return P.fq_activation_ste(x, qcfg)
    last = _LAST_XQ[0]
    key = (x._version, torch.is_grad_enabled(), x.requires_grad, qcfg)
    if last is not None and last[0]() is x and last[1] == key:
        return last[2]
    xq = P.fq_activation_ste(x, qcfg)
    _LAST_XQ[0] = (weakref.ref(x), key, xq)
    return xq


def aligned_linear_forward(mod: nn.Linear, qcfg: QuantConfig, group: list[nn.Linear] | None, x: torch.Tensor,
                           cache: bool = False):
    """y = fq(x) @ fq(W).T (+ b) in fp32, cast to x's dtype; STE to x and W. ``cache``: fq(W) once per version."""
    def amax():  # fused per-tensor scale: max over q|k|v or gate|up
        return None if group is None else torch.stack([P.weight_amax(m.weight, qcfg) for m in group]).amax(0)  # [1, 1]

    if cache:
        deps = () if group is None else tuple(m.weight for m in group if m is not mod)
        w = fq_weight_ste_cached(mod, "weight", mod.weight, qcfg, amax, deps)  # [N, K] fp32
    else:
        w = P.fq_weight_ste(mod.weight, qcfg, amax())  # [N, K] fp32
    xq = _shared_fq_activation(x, qcfg)  # [..., K] fp32
    y = nn.functional.linear(xq, w)  # [..., N] fp32
    if mod.bias is not None:
        y = y + mod.bias.to(x.dtype).float()
    return y.to(x.dtype)


def aligned_experts_forward(mod: nn.Module, qcfg: QuantConfig, hidden_states, top_k_index, top_k_weights,
                            cache: bool = False):
    if cache:
        gu = fq_weight_ste_cached(mod, "gate_up_proj", mod.gate_up_proj, qcfg)  # [E, 2I, H] fp32
        dn = fq_weight_ste_cached(mod, "down_proj", mod.down_proj, qcfg)  # [E, H, I] fp32
    else:
        gu = P.fq_weight_ste(mod.gate_up_proj, qcfg)  # [E, 2I, H] fp32, per expert per output channel
        dn = P.fq_weight_ste(mod.down_proj, qcfg)  # [E, H, I] fp32

    def gemm(w):
        return lambda e, x: nn.functional.linear(P.fq_activation_ste(x, qcfg), w[e]).to(x.dtype)

    return experts_loop(hidden_states, top_k_index, top_k_weights, gu.shape[0], mod.act_fn, gemm(gu), gemm(dn))


@contextlib.contextmanager
def aligned(model: nn.Module, qcfg: QuantConfig, cache_weights: bool = True):
    """Context manager: the learner's forward runs the executor's quantize-dequantize (see module doc).
    ``cache_weights``: fake-quantize each weight once per version (same numbers; see the module doc)."""
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
                m.forward = (lambda m, grp: lambda x: aligned_linear_forward(m, qcfg, grp, x, cache_weights))(m, grp)
                patched.append(m)
            for m in experts.values():
                check_experts_layout(m)
                m.forward = (lambda m: lambda h, i, w: aligned_experts_forward(m, qcfg, h, i, w, cache_weights))(m)
                patched.append(m)
        if qcfg.quantizes_kv:
            from interq.kernels.causal_attention import NAME as LEARNER_KERNEL

            if old_attn not in ("sdpa", "eager", LEARNER_KERNEL):
                raise NotImplementedError(f"aligned: attention implementation {old_attn!r} is not supported "
                                          f"(accepted: 'sdpa', 'eager', {LEARNER_KERNEL!r})")
            cfg._interq_kv_qcfg = qcfg
            cfg._attn_implementation = _register(old_attn)
        yield model
    finally:
        _LAST_XQ[0] = None
        for m in patched:
            del m.forward
        cfg._attn_implementation = old_attn
        if hasattr(cfg, "_interq_kv_qcfg"):
            del cfg._interq_kv_qcfg
        model._interq_aligned = False
