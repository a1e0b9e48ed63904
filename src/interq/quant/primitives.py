"""Quantization primitives: pure tensor functions, one per kernel they mirror (docs/executor.md).

Integer widths: the int8 quantizers take ``bits`` (2..8, ``QuantConfig.w_bits`` / ``a_bits`` / ``kv_bits``):
symmetric with qmax = 2**(bits-1) - 1, so only the scale (amax/qmax) and the clamp change; the codes stay
int8 tensors. At ``bits=8`` every formula below is the 8-bit one, operation for operation.

Conventions: every quantizer returns ``(q, scale)`` with ``x ~= q.float() * scale`` (scale broadcastable,
fp32); rounding and saturation are explicit (``torch.round`` is half-to-even; fp8 values are clamped to
+-448 *before* the cast, since CPU torch saturates and CUDA torch gives NaN).

The fake-quant functions (``fake_quant_weight``, ``fake_quant_activation``, ``fake_quant_kv``) return the
dequantized fp32 tensor; the ``*_ste`` wrappers add a straight-through estimator (gradient identity where
the value was not clipped, zero where it was). They take a ``QuantConfig`` and are what the aligned
learner forward and the verl integration build on.
"""

from __future__ import annotations

import torch

from interq.quant.config import QuantConfig, int_qmax

E4M3_MAX = 448.0
FP8_TOKEN_MIN_SCALE = 1.0 / (E4M3_MAX * 512.0)  # vLLM dynamic_per_token_scaled_fp8_quant floor
KV_MIN_SCALE = 1e-6  # vLLM per-token-head KV floor
BLOCK = 128


# ----------------------------------------------------------------------------------------- rounding
def round_half_away(v: torch.Tensor) -> torch.Tensor:
    """Round half away from zero (Triton ``libdevice.round``; SGLang's per-token int8)."""
    return torch.sign(v) * torch.floor(v.abs() + 0.5)


def round_int8(v: torch.Tensor, mode: str) -> torch.Tensor:
    if mode == "half_even":
        return torch.round(v)
    if mode == "half_away":
        return round_half_away(v)
    if mode == "trunc":
        return torch.trunc(v)
    raise ValueError(f"rounding mode {mode!r} is not one of 'half_even', 'half_away', 'trunc'")


def fp8_cast(v: torch.Tensor, store: str = "round") -> torch.Tensor:
    """fp32 -> float8_e4m3fn with saturation: clamp to +-448 then cast (RNE, ``store='round'``) or
    truncate the extra mantissa bits toward zero (``store='trunc'``, vLLM-CPU's KV store)."""
    v = v.float().clamp(-E4M3_MAX, E4M3_MAX)
    r = v.to(torch.float8_e4m3fn)
    if store == "round":
        return r
    if store != "trunc":
        raise ValueError(f"fp8 store {store!r} is not one of 'round', 'trunc'")
    # e4m3fn is sign-magnitude with a monotone magnitude code: one code down = next value toward zero.
    over = r.float().abs() > v.abs()
    bits = r.view(torch.uint8)
    return torch.where(over, bits - 1, bits).view(torch.float8_e4m3fn)


# ------------------------------------------------------------------------------------------ weights
def _amax(w: torch.Tensor, granularity: str) -> torch.Tensor:
    """amax of |w| over the reduction of ``granularity``; w: [..., N, K] (3-D for fused MoE experts)."""
    a = w.detach().float().abs()
    if granularity == "channel":
        return a.amax(dim=-1, keepdim=True)  # [..., N, 1]
    if granularity == "tensor":
        return a.amax(dim=(-2, -1), keepdim=True)  # [..., 1, 1]  (per expert for 3-D)
    raise ValueError(f"granularity {granularity!r} has no simple amax (accepted: 'channel', 'tensor')")


def weight_amax(w: torch.Tensor, qcfg: QuantConfig) -> torch.Tensor:
    """The amax a weight's scale is computed from (for sharing one over a fused q|k|v or gate|up group)."""
    return _amax(w, qcfg.w_granularity)


def _pad_last2(w: torch.Tensor, mult: int) -> torch.Tensor:
    n, k = w.shape[-2:]
    pn, pk = (-n) % mult, (-k) % mult
    if pn or pk:
        w = torch.nn.functional.pad(w, (0, pk, 0, pn))
    return w


def quant_weight_int8(w: torch.Tensor, granularity: str = "channel", int8_range: str = "sym127",
                      amax: torch.Tensor | None = None, bits: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """int8 weight, symmetric. ``sym127``: s = amax/127, q = clamp(round(w/s), -127, 127) (vLLM online int8);
    ``full127p5``: s = max(amax/127.5, eps), q = round(clamp(w/s, -128, 127)) (compressed-tensors / torchao).
    ``bits`` < 8 replaces 127 by qmax = 2**(bits-1) - 1 (and 127.5, -128 by qmax + 0.5, -(qmax + 1)).
    w: [..., N, K] -> q int8 [..., N, K], s fp32 [..., N, 1] (channel) or [..., 1, 1] (tensor).
    An all-zero row gets s = 1 (q = 0) instead of vLLM's NaN."""
    qmax = int_qmax(bits)
    wf = w.detach().float()  # [..., N, K]
    amax = _amax(wf, granularity) if amax is None else amax.float()
    if int8_range == "sym127":
        s = torch.where(amax > 0, amax / float(qmax), torch.ones_like(amax))
        q = torch.round(wf / s).clamp(-qmax, qmax)
    elif int8_range == "full127p5":
        s = (amax / (qmax + 0.5)).clamp(min=torch.finfo(torch.float32).eps)
        q = torch.round((wf / s).clamp(-(qmax + 1), qmax))
    else:
        raise ValueError(f"int8_range {int8_range!r} is not one of 'sym127', 'full127p5'")
    return q.to(torch.int8), s


def quant_weight_fp8(w: torch.Tensor, granularity: str = "tensor",
                     amax: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """fp8 e4m3 weight. ``tensor``: s = amax/448, q = cast(w * (1/s)) (vLLM ``scaled_fp8_quant``: reciprocal
    multiply); ``channel``: s = max(amax_row/448, 1e-10), q = cast(w / s) (SGLang); ``block128``:
    s = max(amax_blk, 1e-4)/448 per 128x128 block, q = cast(w / s) (vLLM ``per_block_cast_to_fp8``).
    w: [..., N, K] -> q e4m3 [..., N, K]; s [..., 1, 1] | [..., N, 1] | [..., ceil(N/128), ceil(K/128)]."""
    wf = w.detach().float()  # [..., N, K]
    if granularity == "tensor":
        amax = _amax(wf, "tensor") if amax is None else amax.float()
        s = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))  # [..., 1, 1]
        return fp8_cast(wf * (1.0 / s)), s
    if granularity == "channel":
        amax = _amax(wf, "channel") if amax is None else amax.float()
        s = (amax / E4M3_MAX).clamp(min=1e-10)  # [..., N, 1]
        return fp8_cast(wf / s), s
    if granularity == "block128":
        n, k = wf.shape[-2:]
        wp = _pad_last2(wf, BLOCK)  # [..., Np, Kp]
        nb, kb = wp.shape[-2] // BLOCK, wp.shape[-1] // BLOCK
        blocks = wp.reshape(*wp.shape[:-2], nb, BLOCK, kb, BLOCK)  # [..., nb, 128, kb, 128]
        s = blocks.abs().amax(dim=(-3, -1), keepdim=True).clamp(min=1e-4) / E4M3_MAX  # [..., nb, 1, kb, 1]
        q = fp8_cast(blocks / s).reshape(wp.shape)[..., :n, :k]
        return q, s.reshape(*wp.shape[:-2], nb, kb)
    raise ValueError(f"fp8 weight granularity {granularity!r} is not one of 'tensor', 'channel', 'block128'")


def expand_block_scale(s: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """[..., nb, kb] block scale -> [..., n, k] elementwise scale."""
    return s.repeat_interleave(BLOCK, dim=-2).repeat_interleave(BLOCK, dim=-1)[..., :n, :k]


def quant_weight(w: torch.Tensor, qcfg: QuantConfig, amax: torch.Tensor | None = None):
    """Dispatch on ``qcfg.w_format`` / ``w_granularity``; ``amax`` overrides the reduction (fused groups)."""
    if qcfg.w_format == "int8":
        return quant_weight_int8(w, qcfg.w_granularity, qcfg.w_int8_range, amax, qcfg.w_bits)
    if qcfg.w_format == "fp8_e4m3":
        return quant_weight_fp8(w, qcfg.w_granularity, amax)
    raise ValueError(f"QuantConfig.w_format={qcfg.w_format!r} quantizes no weights; accepted: 'int8', 'fp8_e4m3'")


def dequant_weight(q: torch.Tensor, s: torch.Tensor, granularity: str) -> torch.Tensor:
    if granularity == "block128":
        return q.float() * expand_block_scale(s, q.shape[-2], q.shape[-1])
    return q.float() * s


# -------------------------------------------------------------------------------------- activations
_NARROW = (torch.float32, torch.bfloat16, torch.float16)


def _narrow_float(x: torch.Tensor) -> torch.Tensor:
    """x itself when fp32 or narrower (promoting it to fp32 inside an op is exact), else ``x.float()``."""
    return x if x.dtype in _NARROW else x.float()


def quant_act_int8_token(x: torch.Tensor, rounding: str = "half_even",
                         bits: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM ``dynamic_scaled_int8_quant``: inv = 127/amax (0 if amax = 0), q = sat8(round(x * inv)),
    s = amax/127. ``bits`` < 8: 127 -> qmax = 2**(bits-1) - 1 and sat to [-(qmax + 1), qmax] (the scale keeps
    every code in [-qmax, qmax]). x: [..., K] -> q int8 [..., K], s fp32 [..., 1]."""
    qmax = int_qmax(bits)
    x = _narrow_float(x.detach() if x.requires_grad else x)  # [..., K]
    # Written for few ops (the executor runs this once per quantized GEMM input, decode is overhead-bound);
    # value for value the reference ``xf = x.float(); amax = xf.abs().amax(-1); inv = where(amax == 0, 0,
    # qmax / amax); q = clamp(round(xf * inv))`` (tested bit for bit): abs and max are exact in x's dtype, and
    # ``qmax / amax`` on a tensor is ``amax.reciprocal() * qmax`` in torch (Tensor.__rtruediv__), kept as such.
    amax = x.abs().amax(dim=-1, keepdim=True).float()  # [..., 1] fp32
    inv = amax.reciprocal().mul_(float(qmax)).masked_fill_(amax == 0, 0.0)  # [..., 1]
    v = torch.mul(x, inv)  # [..., K] fp32: x promoted to fp32 (exact), one rounding, as xf * inv
    v = v.round_() if rounding == "half_even" else round_int8(v, rounding)
    return v.clamp_(-(qmax + 1), qmax).to(torch.int8), amax / float(qmax)


def quant_act_fp8_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM ``dynamic_per_token_scaled_fp8_quant``: s = max(amax/448, 1/(448*512)), q = cast(x / s).
    x: [..., K] -> q e4m3 [..., K], s fp32 [..., 1]."""
    xf = x.detach().float()
    s = (xf.abs().amax(dim=-1, keepdim=True) / E4M3_MAX).clamp(min=FP8_TOKEN_MIN_SCALE)  # [..., 1]
    return fp8_cast(xf / s), s


def quant_act_fp8_group(x: torch.Tensor, group: int = BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM ``per_token_group_quant_fp8``: s_g = max(amax_g, 1e-10)/448 (>= 1/(448*512)), q = cast(x / s_g).
    K is zero-padded to a multiple of ``group``. x: [..., K] -> q e4m3 [..., Kp], s fp32 [..., Kp/group]."""
    xf = x.detach().float()
    k = xf.shape[-1]
    if k % group:
        xf = torch.nn.functional.pad(xf, (0, (-k) % group))
    g = xf.unflatten(-1, (-1, group))  # [..., G, group]
    s = (g.abs().amax(dim=-1, keepdim=True).clamp(min=1e-10) / E4M3_MAX).clamp(min=FP8_TOKEN_MIN_SCALE)  # [..., G, 1]
    return fp8_cast(g / s).flatten(-2), s.squeeze(-1)


# ------------------------------------------------------------------------------------------ KV cache
def quant_kv(t: torch.Tensor, qcfg: QuantConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize K or V once, when written. t: [B, H, T, D] -> q [B, H, T, D], s fp32 [B, H, T, 1]
    (per token and head) or [] (``fp8_tensor``).

    per-token-head (vLLM ``triton_reshape_and_cache_flash``): s = max(amax_d/QMAX, 1e-6),
    q = store(clamp(t * (1/s), QMIN, QMAX)) with QMAX = 448 (fp8) or 2**(kv_bits-1) - 1 (int, 127 at 8 bits),
    QMIN = -(QMAX + 1) for int; ``fp8_tensor``: q = cast(t / kv_tensor_scale)."""
    fmt = qcfg.kv_format
    tf = t.detach().float() if fmt != "int8_per_token_head" else None  # [B, H, T, D]
    if fmt == "fp8_tensor":
        s = torch.tensor(float(qcfg.kv_tensor_scale), dtype=torch.float32, device=t.device)
        return fp8_cast(tf / s, qcfg.fp8_store), s
    if fmt == "int8_per_token_head":
        # few ops (once per layer and decode step), value for value ``s = clamp(amax(|tf|) / qmax, 1e-6)``,
        # ``q = round(clamp(tf * (1.0 / s)))``: ``1.0 / s`` is ``s.reciprocal() * 1.0`` in torch, exactly the
        # reciprocal; clamping to integer bounds commutes with rounding; abs/max are exact in t's dtype.
        qmax = int_qmax(qcfg.kv_bits)
        td = _narrow_float(t.detach() if t.requires_grad else t)
        s = td.abs().amax(dim=-1, keepdim=True).float().div_(float(qmax)).clamp_(min=KV_MIN_SCALE)  # [B, H, T, 1]
        v = torch.mul(td, s.reciprocal()).clamp_(-(qmax + 1), qmax)  # [B, H, T, D] fp32
        v = v.round_() if qcfg.kv_int8_store == "round" else v.trunc_()
        return v.to(torch.int8), s
    if fmt == "fp8_per_token_head":
        s = (tf.abs().amax(dim=-1, keepdim=True) / E4M3_MAX).clamp(min=KV_MIN_SCALE)  # [B, H, T, 1]
        return fp8_cast(tf * (1.0 / s), qcfg.fp8_store), s
    raise ValueError(f"QuantConfig.kv_format={fmt!r} stores no quantized KV; accepted: 'int8_per_token_head', "
                     "'fp8_per_token_head', 'fp8_tensor'")


def dequant_kv(q: torch.Tensor, s: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Read path: q.float() * s, then the compute dtype (FlashInfer / Triton dequantizing backends)."""
    if q.dtype == torch.int8 and s.dim() > 0:  # int8 * fp32 promotes to fp32 (exact codes): one op fewer
        return torch.mul(q, s).to(dtype)
    return (q.float() * s).to(dtype)


# ------------------------------------------------------------------------ fake quant (dequantized)
def fake_quant_weight(w: torch.Tensor, qcfg: QuantConfig, amax: torch.Tensor | None = None) -> torch.Tensor:
    """Dequantized weight, fp32, same shape as w ([..., N, K])."""
    q, s = quant_weight(w, qcfg, amax)
    return dequant_weight(q, s, qcfg.w_granularity)


def fake_quant_activation(x: torch.Tensor, qcfg: QuantConfig) -> torch.Tensor:
    """Dequantized dynamic activation, fp32, same shape as x ([..., K])."""
    if qcfg.w_format == "int8":
        q, s = quant_act_int8_token(x, qcfg.a_int8_rounding, qcfg.a_bits)
        return q.float() * s
    if qcfg.w_format == "fp8_e4m3":
        if qcfg.a_granularity == "group128":
            k = x.shape[-1]
            q, s = quant_act_fp8_group(x)  # [..., Kp], [..., G]
            return (q.float().unflatten(-1, (-1, BLOCK)) * s.unsqueeze(-1)).flatten(-2)[..., :k]
        q, s = quant_act_fp8_token(x)
        return q.float() * s
    raise ValueError(f"QuantConfig.w_format={qcfg.w_format!r} quantizes no activations; accepted: 'int8', 'fp8_e4m3'")


def fake_quant_kv(t: torch.Tensor, qcfg: QuantConfig) -> torch.Tensor:
    """Quantize-dequantize K or V per the KV format, back in t's dtype (what the cache returns on read)."""
    q, s = quant_kv(t, qcfg)
    return dequant_kv(q, s, t.dtype)


# --------------------------------------------------------------------------- straight-through estimator
def ste(x: torch.Tensor, x_fq: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
    """Forward value ``x_fq`` exactly; gradient w.r.t. x is the identity (times ``keep``: 1 where x was
    representable, 0 where it was clipped). Scales are treated as constants."""
    d = x - x.detach()  # zero in value, identity in gradient
    if keep is not None:
        d = d * keep.to(d.dtype)
    return x_fq.detach() + d


def _keep_int8(x: torch.Tensor, s: torch.Tensor, bits: int = 8) -> torch.Tensor:
    return (x.detach().float() / s).abs() <= int_qmax(bits) + 0.5


def _keep_fp8(x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    return (x.detach().float() / s).abs() <= E4M3_MAX * (1 + 2.0**-5)  # values that round to <= 448


def fq_weight_ste(w: torch.Tensor, qcfg: QuantConfig, amax: torch.Tensor | None = None) -> torch.Tensor:
    """Fake-quantized weight (fp32) whose gradient reaches the high-precision ``w``. Dynamic scales cover
    amax, so nothing is clipped and the gradient is the identity."""
    return ste(w, fake_quant_weight(w, qcfg, amax))


def fq_activation_ste(x: torch.Tensor, qcfg: QuantConfig) -> torch.Tensor:
    """Fake-quantized dynamic activation (fp32) with an identity STE (per-token scales never clip)."""
    return ste(x, fake_quant_activation(x, qcfg))


def fq_kv_ste(t: torch.Tensor, qcfg: QuantConfig) -> torch.Tensor:
    """Fake-quantized K or V (t's dtype) with an STE that is zero where a fixed scale clipped
    (``fp8_tensor``) and the identity elsewhere."""
    q, s = quant_kv(t, qcfg)
    keep = _keep_fp8(t, s) if qcfg.kv_format.startswith("fp8") else _keep_int8(t, s, qcfg.kv_bits)
    return ste(t, dequant_kv(q, s, t.dtype), keep)
