"""Packed-GQA decode attention for rollout executors (``rollout.attention=sdpa_packed``, the default since
NUMERICS_VERSION 2).

What it fixes (measured 2026-12-02, docs/performance.md "Rollout"): transformers' ``sdpa`` attention takes one
of two paths for a single query token of a grouped-query model, decided by the batch. When some row is padded the
mask is kept and the query heads of each KV head are packed as rows of one attention call ([B, H_kv, G, D]); when
no row is padded transformers drops the mask and calls torch's SDPA with ``enable_gqa=True`` ([B, H, 1, D]), which
torch's CPU flash kernel runs as B x H one-row problems: 3.3-6.1x slower in bf16 for SmolLM2's shapes at 40-2,000
cached tokens (``benchmarks/bench_attention.py``), and not always the same bits as the packed path (one bf16 ulp
in some outputs, seen at 400-2,000 cached tokens). So a rollout's numbers could depend on whether its batch happened
to be aligned, and aligned batches were slow.

``sdpa_packed`` always packs a single query token (with or without a mask), runs a masked CPU prefill of a GQA
model with torch's ``enable_gqa`` instead of transformers' copy of K/V per query head (the same bits), and leaves
everything else (an unmasked prefill, models without GQA, soft-capping, position biases, other devices) to
transformers' own ``sdpa`` function, so an episode's decode takes the same kernel path whatever its batch. The
values equal transformers' packed path (its ragged-batch path) bit for bit; against the unpadded ``enable_gqa`` path, mostly bit for bit and otherwise to rounding. The
rollout's default (``interq.train.build``); ``rollout.attention=sdpa`` keeps transformers' choice, the numerics of
the study's recorded runs (NUMERICS_VERSION 1). The learner is never given it.

Where interq's CPU kernels are built for a CPU with AMX-BF16, ``sdpa_packed``'s decode calls torch's flash kernel's
computation in one call (``flash_decode_amx``: the same bits, found step by step against torch 2.13 and checked per
shape and thread count on a probe when first used, :func:`flash_decode_matches`; torch's own call otherwise, or
after :func:`use_flash_decode` ``(False)``): torch runs each (row, KV head) of a decode as blocks of 512 keys through
two oneDNN GEMM calls each, whose fixed cost dominates at a rollout's sizes (1.3-2.2x per layer call at SmolLM2's
shapes, 48-2,000 cached tokens, on an Intel Xeon with AMX on 2026-12-03).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from interq import switches

NAME = "interq_sdpa_packed"
ATTENTION_CHOICES = ("sdpa", "sdpa_packed")
NAMES = {"sdpa_packed": NAME}  # rollout.attention -> the registered name


def _special(kwargs: dict, dropout) -> bool:
    """Soft-capping, position biases or dropout: transformers' own function handles those."""
    return kwargs.get("softcap") is not None or kwargs.get("position_bias") is not None or bool(dropout)


def sdpa_packed_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                          is_causal=None, **kwargs):
    """transformers' attention-function signature: query [B, H, q, D], key/value [B, H_kv, K, D]
    -> ([B, q, H, Dv], None)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = getattr(module, "num_key_value_groups", 1)
    special = _special(kwargs, dropout)
    if query.shape[2] > 1 and attention_mask is not None and groups > 1 and not special and query.device.type == "cpu":
        # a masked prefill: torch's CPU flash kernel reads each KV head for its query heads (enable_gqa) instead of
        # transformers' repeat_kv copy of the whole cache, per layer: the same bits (tested), 1.2x faster at a
        # rollout's shapes (16 rows x 221 new tokens over 2,051 columns, bf16)
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, scale=scaling,
                                             enable_gqa=True)  # [B, H, q, Dv]
        return out.transpose(1, 2).contiguous(), None
    if query.shape[2] != 1 or groups == 1 or special:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    b, h, _, d = query.shape
    out = flash_decode_rows(query, key, value, attention_mask, scaling, groups)
    if out is not None:
        return out.view(b, 1, h, value.shape[-1]), None
    hkv = h // groups
    q = query.reshape(b, hkv, groups, d)  # [B, H_kv, G, D]: the G query heads of a KV head as G rows
    mask = attention_mask  # None or [B|1, 1|H, 1, K]
    if mask is not None and mask.shape[1] != 1:
        mask = mask.reshape(mask.shape[0], hkv, groups, mask.shape[-1])  # per-head masks follow their heads
    out = F.scaled_dot_product_attention(q, key, value, attn_mask=mask, scale=scaling)  # [B, H_kv, G, Dv]
    out = out.reshape(out.shape[0], h, 1, value.shape[-1]).transpose(1, 2).contiguous()  # [B, 1, H, Dv]
    return out, None


def flash_decode_rows(query, key, value, attention_mask, scaling, groups: int):
    """``sdpa_packed``'s decode of one query token per row by the one-call flash kernel, where it applies
    (:func:`_flash_decode`; a mask shared by the heads): query [B, H, 1, D], key / value [B, H_kv, K, D] ->
    [B, 1, H * Dv] (the layout of transformers' attention output), else None."""
    if not _FLASH["enabled"] or (attention_mask is not None and attention_mask.shape[1] != 1):
        return None
    b, h, _, d = query.shape
    out = _flash_decode(query.reshape(b, h // groups, groups, d), key, value, attention_mask, scaling)
    return None if out is None else out.view(b, 1, h * value.shape[-1])  # [B, H_kv, G, Dv] in memory


# torch's flash kernel in one call (interq's flash_decode_amx): per (G, D, thread count) whether it equals torch's
# on the probe (None: not asked yet); "enabled": use_flash_decode
_FLASH: dict = {
    "enabled": switches.flag("INTERQ_FLASH_DECODE")}  # refused unless accepted
FLASH_PROBE_LENGTHS = (1, 17, 64, 300, 513, 1100)  # one and several blocks of 512 keys, whole and partial vectors


def use_flash_decode(enabled: bool) -> None:
    """Turn the one-call flash decode on or off for this process (on by default where it applies, unless
    ``INTERQ_FLASH_DECODE=0``): off, every decode takes torch's ``F.scaled_dot_product_attention`` (the same values;
    for side-by-side timing)."""
    _FLASH["enabled"] = bool(enabled)


def flash_decode_matches(groups: int, d: int) -> bool:
    """Whether interq's ``flash_decode_amx`` gives torch's bits for decode problems of ``groups`` query rows of
    head size ``d`` at the current thread count: asked once per process on a probe (random bf16 problems of
    :data:`FLASH_PROBE_LENGTHS` cached tokens, with and without a padding mask), then remembered. False where the
    kernels or AMX-BF16 are missing, or the shape is outside the kernel's (G 2-16, D a multiple of 32 up to 256)."""
    from interq import kernels

    mod = kernels.get()
    if mod is None or not hasattr(mod, "flash_decode_amx") or not 2 <= groups <= 16 or d % 32 or d > 256:
        return False
    key = (groups, d, torch.get_num_threads())
    ok = _FLASH.get(key)
    if ok is None:
        ok = bool(mod.has_bf16_gemm_amx())
        gen = torch.Generator().manual_seed(0)
        # (batch, KV heads): one problem (torch's loop then runs inline, outside a parallel region) and several
        shapes = [(2, 2)] * len(FLASH_PROBE_LENGTHS) + [(1, 1), (2, 4)]
        for length, (b, hkv) in zip(FLASH_PROBE_LENGTHS + (300, 300), shapes) if ok else ():
            q = (torch.randn(b, hkv, groups, d, generator=gen) * 2).bfloat16()
            k = (torch.randn(b, hkv, length, d, generator=gen) * 2).bfloat16()
            v = torch.randn(b, hkv, length, d, generator=gen).bfloat16()
            keep = torch.ones(b, 1, 1, length, dtype=torch.bool)
            keep[-1, ..., : length // 3] = False
            for mask in (None, keep):
                ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
                out, exact = mod.flash_decode_amx(q, k, v, mask, 1.0 / math.sqrt(d))
                ok = ok and exact and torch.equal(out.view(torch.int16), ref.view(torch.int16))
        _FLASH[key] = ok
    return ok


def _flash_decode(q, key, value, mask, scaling):
    """``F.scaled_dot_product_attention(q, key, value, attn_mask=mask, scale=scaling)`` of packed decode rows
    ([B, H_kv, G, D]) by ``flash_decode_amx`` where it gives torch's bits (:func:`flash_decode_matches`), else None."""
    if not _FLASH["enabled"] or q.device.type != "cpu":
        return None
    if torch.is_grad_enabled() and (q.requires_grad or key.requires_grad or value.requires_grad
                                    or (mask is not None and mask.requires_grad)):
        return None  # no gradient through the kernel: torch's call
    # torch's own call takes another path (math attention, or GEMMs without oneDNN) when these are turned off
    if not (torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled
            and torch.backends.cuda.flash_sdp_enabled()):
        return None
    if not (q.dtype == key.dtype == value.dtype == torch.bfloat16) or value.shape[-1] != q.shape[-1]:
        return None
    if key.shape[2] == 0:  # nothing to attend to: torch's own answer
        return None
    if q.stride(-1) != 1 or key.stride(-1) != 1 or value.stride(-1) != 1:
        return None
    if mask is not None and not (mask.dim() == 4 and mask.shape[1] == 1 and mask.shape[2] == 1
                                 and mask.shape[0] in (1, q.shape[0]) and mask.shape[3] == key.shape[2]
                                 and mask.dtype in (torch.bool, torch.bfloat16)):  # the masks torch takes here
        return None
    if not flash_decode_matches(q.shape[2], q.shape[3]):
        return None
    scale = scaling if scaling is not None else 1.0 / math.sqrt(q.shape[-1])  # torch's default, in double
    out, exact = _kernels_module().flash_decode_amx(q, key, value, mask, float(scale))
    return out if exact else None


def _kernels_module():
    from interq import kernels

    return kernels.get()


def register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, sdpa_packed_attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)
