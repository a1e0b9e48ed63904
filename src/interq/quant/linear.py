"""The executor's quantized GEMMs (docs/executor.md) and the modules that hold quantized weights.

- int8: ``acc = torch._int_mm(q_act[M, K], q_wT[K, N])`` (exact int32), then the CUTLASS epilogue
  ``y = s_a * (s_w * float(acc))`` in fp32 (bias by one fused multiply-add, emulated in float64), cast to
  the compute dtype. Shapes ``_int_mm`` cannot take (K or N not a multiple of 8, or M <= 16 on CUDA) are
  zero-padded, which is exact; never a float fallback. The same int32 accumulator can instead come from
  the ``fp32_exact`` backend (an fp32 GEMM of the integer codes in K-chunks of 1024, exact by a bound,
  bit-identical): on CPUs without VNNI (this project's AVX2 dev machine) ``_int_mm`` runs a slow
  reference path and this is several times faster. On CPUs with AVX512-VNNI the ``vnni`` backend computes it for
  few rows (decode, M <= ``VNNI_MAX_M``) with :mod:`interq.kernels`' ``int8_gemm_vnni`` from a copy of the
  weights packed for ``vpdpbusd``, and with ``_int_mm`` above. On CPUs with AMX-INT8 (Intel Sapphire Rapids and
  later) the ``amx`` backend computes it for any number of rows from the same packed weights with AMX tiles
  (``int8_gemm_amx``: about 1.2-1.7 TOPS on one core from 64 rows up, against 0.3-0.65 for the VNNI kernel and
  ``_int_mm``). On CPUs with AVX2 but no AVX-512 (AMD Zen 2 / 3, Intel client CPUs) the ``avx2`` backend computes
  it for any number of rows from the same packed weights (``int8_gemm_avx2``: int16 products by ``vpmaddwd``; at
  decode sizes about twice ``fp32_exact``, which reads the codes as fp32, and level with it at prefill sizes). The
  backend never changes a single bit of output.
- fp8 e4m3: operands cast to e4m3 after clamping, products summed in float64 (exact for these K: order
  and batch invariant), scales applied in the same order. Hopper's FastAccum fp8 GEMM accumulates in
  reduced precision (~1e-3 relative): that is a documented tolerance, not reproduced.

Narrower integer widths (``QuantConfig.w_bits`` / ``a_bits`` in 2..8) only change the codes' scale and
clamp: they are still int8 tensors through the same kernels and exact int32 accumulators.
"""

from __future__ import annotations

import os

import torch
from torch import nn

from interq import kernels
from interq.quant import primitives as P
from interq.quant.config import QuantConfig, int_qmax

INT8_BACKENDS = ("auto", "int_mm", "fp32_exact", "vnni", "amx", "avx2")
PACKED_BACKENDS = ("vnni", "amx", "avx2")  # the backends that multiply from vnni_pack's layout
_FP32_EXACT_K = 1024  # 128 * 128 * 1024 = 2^24: every partial sum of int8 products is an exact fp32 integer
# Rows up to which the vnni backend uses its own kernel, above them torch._int_mm: SmolLM2-135M's 30 layers of
# q|k|v, o, gate|up and down (weights from memory, as in a decode step), Zen 5 EPYC, 2 threads: the kernel takes
# 4.9 against 10.0 ms at 16 rows, 7.0 / 11.6 at 32, 11.5 / 17.9 at 64, 39.6 / 45.5 at 256, 76 / 81 at 512, 369 / 301
# at 2048; 1 thread: 9.1 / 13.4 at 16 rows, even at 256 (results/benchmarks/zen5-avx512-vnni/2026-12-02-vnni-decode-gemm/vnni_gemm.log)
VNNI_MAX_M = 256


def vnni_available() -> tuple[bool, str]:
    """Whether the ``vnni`` backend can run here (the CPU kernels built for a CPU with AVX512-VNNI), and why not."""
    return kernels.offers("has_int8_gemm_vnni", "this CPU has no AVX512-VNNI (the kernels were built without "
                                                "int8_gemm_vnni)")


def avx2_available() -> tuple[bool, str]:
    """Whether the ``avx2`` backend can run here (the CPU kernels built for a CPU with AVX2), and why not."""
    return kernels.offers("has_int8_gemm_avx2", "this CPU has no AVX2 (the kernels were built without int8_gemm_avx2)")


def amx_available() -> tuple[bool, str]:
    """Whether the ``amx`` backend can run here (the CPU kernels built for a CPU with AMX-INT8, on a Linux kernel that
    lets the process use AMX tiles), and why not."""
    ok, why = vnni_available()
    if not ok:
        return ok, why
    if not kernels.get().has_int8_gemm_amx():
        return False, ("this CPU has no AMX-INT8, or the Linux kernel does not grant AMX tiles (the kernels' "
                       "has_int8_gemm_amx() is false)")
    return True, "available"


_INT_MM_EXACT: dict = {}
_ISA_CAPS = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")  # oneDNN's own cap on the instruction set it uses


def int_mm_exact() -> tuple[bool, str]:
    """Whether ``torch._int_mm`` gives the exact int32 sums on this CPU in this process, and why not (asked once).

    torch sends a CPU ``_int_mm`` to oneDNN where the CPU has AVX512-VNNI (else to its own exact reference loop).
    oneDNN's int8 GEMM without VNNI multiplies pairs of codes into *saturating* int16 sums (``vpmaddubsw``), so where
    ``ONEDNN_MAX_CPU_ISA`` caps oneDNN below VNNI on a CPU that has it, the sums are wrong wherever two products are
    large. The probe: codes of -128 and 127 only (every pair saturates), against the float64 product."""
    if "v" not in _INT_MM_EXACT:
        g = torch.Generator().manual_seed(0)
        a = torch.where(torch.rand(16, 256, generator=g) < 0.5, -128, 127).to(torch.int8)
        w = torch.where(torch.rand(256, 64, generator=g) < 0.5, -128, 127).to(torch.int8)
        ok = torch.equal(torch._int_mm(a, w), (a.double() @ w.double()).to(torch.int32))
        caps = [f"{v}={os.environ[v]}" for v in _ISA_CAPS if os.environ.get(v)]
        why = "exact" if ok else (
            "torch._int_mm's int32 sums are wrong on this CPU in this process (oneDNN's int8 GEMM saturates int16 "
            "pair sums below AVX512-VNNI" + (f"; {' and '.join(caps)} caps it there" if caps else "") + ")")
        _INT_MM_EXACT["v"] = (ok, why)
    return _INT_MM_EXACT["v"]


# the backends that can hand a CPU GEMM to torch._int_mm: int_mm itself, vnni above VNNI_MAX_M rows, amx where K is
# not a multiple of 64
_USES_INT_MM = ("int_mm", "vnni", "amx")
EXACT_WITHOUT_INT_MM = ("fp32_exact", "avx2")


def resolve_int8_backend(backend: str, device: torch.device | None = None) -> str:
    """``int_mm``: ``torch._int_mm``. ``fp32_exact``: the same int32 accumulator computed by an fp32 GEMM of
    the integer codes in K-chunks of <= 1024 (every product and partial sum is an integer below 2^24, so
    each chunk is exact in any summation order; chunks are summed in int32): bit-identical to
    ``_int_mm``, and fast on CPUs without VNNI, where ``_int_mm`` takes a slow reference path. ``vnni``
    (CPU): the compiled AVX512-VNNI kernel for at most ``VNNI_MAX_M`` rows, ``_int_mm`` above; bit-identical too.
    ``amx`` (CPU): the compiled AMX-INT8 tile kernel for any number of rows (where K is a multiple of 64, else as
    ``vnni``), from the same packed weights; bit-identical too. ``avx2`` (CPU): the compiled AVX2 kernel (int16
    products) for any number of rows from the same packed weights; bit-identical too. ``auto``: ``int_mm`` on CUDA;
    on a CPU ``amx`` where it is available, else ``vnni``, else ``int_mm`` where torch's capability is AVX512, else
    ``avx2`` where the kernels have it, else ``fp32_exact``. Where ``torch._int_mm`` is not exact on this CPU
    (:func:`int_mm_exact`), ``auto`` takes ``avx2`` or ``fp32_exact`` and ``int_mm``, ``vnni`` and ``amx`` are
    refused."""
    if backend not in INT8_BACKENDS:
        raise ValueError(f"int8_backend={backend!r} is not one of {INT8_BACKENDS}")
    cuda = device is not None and device.type == "cuda"
    if backend in PACKED_BACKENDS:
        available = {"vnni": vnni_available, "amx": amx_available, "avx2": avx2_available}[backend]
        ok, why = (False, "it is a CPU kernel") if cuda else available()
        if not ok:
            raise ValueError(f"int8_backend={backend!r} cannot run here: {why}; use one of {INT8_BACKENDS}")
    exact, why = (True, "CUDA") if cuda else int_mm_exact()
    if backend in _USES_INT_MM and not exact:
        raise ValueError(f"int8_backend={backend!r} cannot run here: it uses torch._int_mm and {why}; use one of "
                         f"{EXACT_WITHOUT_INT_MM}, or 'auto'")
    if backend != "auto":
        return backend
    if cuda:
        return "int_mm"
    if not exact:
        return "avx2" if avx2_available()[0] else "fp32_exact"
    if amx_available()[0]:
        return "amx"
    if vnni_available()[0]:
        return "vnni"
    if "AVX512" in torch.backends.cpu.get_cpu_capability():
        return "int_mm"
    return "avx2" if avx2_available()[0] else "fp32_exact"


def vnni_pack(wq_t: torch.Tensor) -> torch.Tensor:
    """Weight codes [Kp, Np] int8 (or [E, Kp, Np]) -> the ``vnni`` and ``amx`` backends' layout, uint8 [ceil(Np / 16), Kp / 4,
    16, 4] (or [E, ...]): each code + 128, four k of 16 columns per 64 bytes."""
    mod = kernels.get()
    if wq_t.dim() == 3:
        return torch.stack([mod.pack_int8_vnni(w) for w in wq_t])
    return mod.pack_int8_vnni(wq_t)


def int8_accumulate(q: torch.Tensor, wq_t: torch.Tensor, codes_f32: torch.Tensor | None = None,
                    vnni: torch.Tensor | None = None, backend: str = "int_mm") -> torch.Tensor:
    """The exact int32 accumulator of activation codes q int8 [M, K] and weight codes wq_t int8 [Kp, Np] (K <= Kp:
    q is zero-padded to Kp) -> [M, Np], by the backend whose weight layout is given: ``vnni`` (packed) by AMX tiles
    where ``backend`` is ``amx`` and Kp is a multiple of 64, by the AVX2 kernel where it is ``avx2``, else by the
    VNNI kernel for M <= ``VNNI_MAX_M``; ``fp32_exact`` (``codes_f32``); else ``torch._int_mm``. The same values
    whichever."""
    kp = wq_t.shape[0]
    if q.shape[1] != kp:
        q = nn.functional.pad(q, (0, kp - q.shape[1]))
    mod = kernels.get() if vnni is not None else None  # None too while the kernels are turned off: _int_mm then
    if mod is not None and q.device.type == "cpu":
        if backend == "amx" and kp % 64 == 0:
            return mod.int8_gemm_amx(q, vnni, wq_t.shape[1])
        if backend == "avx2":
            return mod.int8_gemm_avx2(q, vnni, wq_t.shape[1])
        if q.shape[0] <= VNNI_MAX_M:
            return mod.int8_gemm_vnni(q, vnni, wq_t.shape[1])
    if codes_f32 is not None:
        return int_mm_fp32_exact(q, codes_f32)
    return int_mm_padded(q, wq_t)


def register_backend_layouts(module: nn.Module, prefix: str, q: torch.Tensor, int8: bool) -> None:
    """The module's int8 backend's own copies of the weight codes ``q`` ([Kp, Np] or [E, Kp, Np]), derived, not
    saved: ``<prefix>_codes_f32`` (fp32_exact: the codes as float32) and ``<prefix>_vnni`` (vnni, amx, avx2:
    :func:`vnni_pack`),
    each None unless the backend (``module.int8_backend``) uses it."""
    backend = module.int8_backend
    use = int8 and backend == "fp32_exact"
    module.register_buffer(f"{prefix}_codes_f32", q.float() if use else None, persistent=False)
    use = int8 and backend in PACKED_BACKENDS
    module.register_buffer(f"{prefix}_vnni", vnni_pack(q) if use else None, persistent=False)


def follow_backend_layouts(module: nn.Module, prefix: str, q: torch.Tensor) -> None:
    """Weight sync: the copies :func:`register_backend_layouts` made, rewritten from the new codes ``q``."""
    codes, packed = getattr(module, f"{prefix}_codes_f32"), getattr(module, f"{prefix}_vnni")
    if codes is not None:
        codes.copy_(q)
    if packed is not None:
        packed.copy_(vnni_pack(q))


def int_mm_fp32_exact(a: torch.Tensor, b_f32: torch.Tensor) -> torch.Tensor:
    """a int8 [M, K], b_f32 [K, N] float32 holding int8 codes -> exact int32 [M, N] (see resolve_int8_backend)."""
    if torch.get_float32_matmul_precision() != "highest":
        raise RuntimeError("int8 backend 'fp32_exact' needs torch.get_float32_matmul_precision() == 'highest' "
                           "(reduced-precision fp32 matmul would not be exact); use int8_backend='int_mm'")
    k = a.shape[1]
    af = a.float()  # [M, K]
    if k <= _FP32_EXACT_K:
        return (af @ b_f32).to(torch.int32)
    acc = None
    for k0 in range(0, k, _FP32_EXACT_K):
        part = (af[:, k0:k0 + _FP32_EXACT_K] @ b_f32[k0:k0 + _FP32_EXACT_K]).to(torch.int32)  # exact chunk
        acc = part if acc is None else acc + part
    return acc


# torch._int_mm's shape rules on CUDA (cuBLASLt int8): M > 16, K and N multiples of 8. CPU takes any M.
INT_MM_CUDA_MIN_M = 17
INT_MM_MULTIPLE = 8


def int_mm_padding(m: int, k: int, n: int, min_m: int = 1) -> tuple[int, int, int]:
    """Zero rows/columns (pm, pk, pn) that bring an [M, K] x [K, N] int8 GEMM to ``_int_mm``'s shape rules:
    M >= ``min_m`` (``INT_MM_CUDA_MIN_M`` on CUDA), K and N multiples of 8. Zeros add nothing to any
    accumulator, so the product of the padded operands, cropped to [M, N], is the exact unpadded product."""
    for name, v in (("m", m), ("k", k), ("n", n), ("min_m", min_m)):
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"int_mm_padding: {name} must be an int >= 1, got {v!r}")
    return max(min_m - m, 0), (-k) % INT_MM_MULTIPLE, (-n) % INT_MM_MULTIPLE


def int_mm_padded(a: torch.Tensor, b: torch.Tensor, min_m: int | None = None) -> torch.Tensor:
    """Exact int8 x int8 -> int32 GEMM through ``torch._int_mm``; a: [M, K], b: [K, N] -> [M, N].
    Zero-pads by :func:`int_mm_padding` (``min_m``: default ``INT_MM_CUDA_MIN_M`` on CUDA, 1 elsewhere)."""
    if a.dtype != torch.int8 or b.dtype != torch.int8:
        raise TypeError(f"int_mm_padded needs int8 operands, got {a.dtype} and {b.dtype}")
    m, k = a.shape
    k2, n = b.shape
    if k != k2:
        raise ValueError(f"int_mm_padded: inner dimensions differ ({k} vs {k2})")
    if min_m is None:
        min_m = INT_MM_CUDA_MIN_M if a.is_cuda else 1
    pm, pk, pn = int_mm_padding(m, k, n, min_m)
    if pk or pm:
        a = nn.functional.pad(a, (0, pk, 0, pm))
    if pk or pn:
        b = nn.functional.pad(b, (0, pn, 0, pk))
    out = torch._int_mm(a.contiguous(), b)  # [M', N'] int32
    return out[:m, :n] if (pm or pn) else out


def epilogue(acc: torch.Tensor, s_a: torch.Tensor, s_w: torch.Tensor, bias: torch.Tensor | None,
             out_dtype: torch.dtype) -> torch.Tensor:
    """CUTLASS ScaledEpilogue(Bias): ``out(s_a * (s_w * acc))`` or ``out(fma(s_a, s_w * acc, bias))``.
    acc fp32 [M, N], or the int32 accumulator itself (converted to fp32 inside the multiply, RNE above 2^24, as
    ``acc.float()``); s_a [M, 1]; s_w [N] or []; bias [N] (rounded to out_dtype first, as the kernel reads it).
    Three ops without bias (multiply, multiply in place, cast): the same values as the textbook sequence."""
    return epilogue_fp32(acc, s_a, s_w, bias, out_dtype).to(out_dtype)


def epilogue_fp32(acc: torch.Tensor, s_a: torch.Tensor, s_w: torch.Tensor, bias: torch.Tensor | None,
                  out_dtype: torch.dtype) -> torch.Tensor:
    """:func:`epilogue` before its final cast to ``out_dtype``: [M, N] fp32 (a fresh tensor)."""
    if acc.dtype != torch.float32 and (s_w.dim() == 0 or s_w.dtype != torch.float32):
        acc = acc.float()  # a 0-dim scale would not promote the int32 accumulator to fp32
    t = torch.mul(acc, s_w)  # [M, N] fp32: Compute0 = ScaleB * Accum
    if bias is None:
        return t.mul_(s_a)  # Compute1 = ScaleA * Compute0 (multiplication commutes exactly)
    # fma with one rounding; float64 then fp32 equals it up to rare double rounding
    return (s_a.double() * t.double() + bias.to(out_dtype).double()).float()


def quant_act_int8(x2: torch.Tensor, rounding: str, a_bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`primitives.quant_act_int8_token` through the fused CPU kernel where it is loaded (the same values,
    one op instead of ~10: :mod:`interq.kernels`), else the eager primitive. x2 [M, K] -> int8, fp32 [M, 1]."""
    k = kernels.get()
    if k is not None and rounding == "half_even" and not x2.is_cuda and not x2.requires_grad and x2.dim() == 2:
        return tuple(k.quant_act_int8(x2, int_qmax(a_bits)))
    return P.quant_act_int8_token(x2, rounding, a_bits)


def epilogue_split(acc: torch.Tensor, s_a: torch.Tensor, s_w: torch.Tensor, bias: torch.Tensor | None,
                   sizes: tuple[int, ...], out_dtype: torch.dtype) -> list[torch.Tensor]:
    """:func:`epilogue` of the first ``sum(sizes)`` columns, returned as one contiguous [M, n_i] tensor per member
    (a fused group's outputs); one kernel call where :mod:`interq.kernels` is loaded (no bias), same values."""
    k = kernels.get()
    if (k is not None and bias is None and not acc.is_cuda and acc.dtype == torch.int32
            and out_dtype in (torch.float32, torch.bfloat16, torch.float16)):
        return k.epilogue(acc, s_a, s_w, list(sizes), out_dtype)
    y = epilogue_fp32(acc[:, :sum(sizes)] if acc.shape[1] != sum(sizes) else acc, s_a, s_w, bias, out_dtype)
    if len(sizes) == 1:
        return [y.to(out_dtype)]
    outs, start = [], 0
    for n in sizes:
        part = y[:, start:start + n]  # [M, N_i], a strided view
        # a fresh contiguous tensor per member, as the member's own QuantLinear returns
        outs.append(part.to(out_dtype) if out_dtype != part.dtype else part.clone(memory_format=torch.contiguous_format))
        start += n
    return outs


def int8_linear(x2: torch.Tensor, wq_t: torch.Tensor, s_w: torch.Tensor, n_out: int, bias: torch.Tensor | None,
                rounding: str, out_dtype: torch.dtype, codes_f32: torch.Tensor | None = None,
                a_bits: int = 8, vnni: torch.Tensor | None = None, backend: str = "int_mm") -> torch.Tensor:
    """x2 [M, K] float, wq_t int8 [Kp, Np] (padded, transposed), s_w fp32 [N] or [] -> [M, N] out_dtype.
    With ``codes_f32`` (wq_t as float32) or ``vnni`` (wq_t packed by :func:`vnni_pack`, for ``backend``'s kernel) the
    accumulator comes from that backend instead of ``torch._int_mm`` (:func:`int8_accumulate`): the same int32 values. ``a_bits`` < 8
    narrows the activation codes (still int8 tensors); narrower weight codes arrive as they are in ``wq_t``: the
    GEMM and the epilogue do not change."""
    whole = whole_linear(x2, wq_t, vnni, s_w, (n_out,), bias, rounding, a_bits, out_dtype, backend)
    if whole is not None:
        return whole[0]
    q, s_a = quant_act_int8(x2, rounding, a_bits)  # [M, K] int8, [M, 1] fp32
    return int8_gemm(q, s_a, wq_t, s_w, n_out, bias, out_dtype, codes_f32, vnni, backend)


_WHOLE_LINEAR_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def whole_linear(x2: torch.Tensor, wq_t: torch.Tensor, vnni: torch.Tensor | None, s_w: torch.Tensor,
                 sizes: tuple[int, ...], bias: torch.Tensor | None, rounding: str, a_bits: int,
                 out_dtype: torch.dtype, backend: str) -> list[torch.Tensor] | None:
    """The whole W8A8 linear (activation quantization, accumulator, each member's epilogue) in one call of the
    kernels' ``int8_linear_amx`` or ``int8_linear_avx2`` where it applies (:func:`whole_linear_kernel`, no
    autograd): the values of :func:`quant_act_int8`, :func:`int8_accumulate` and :func:`epilogue_split` called in
    turn (tested), one contiguous [M, N_i] tensor per member; None elsewhere."""
    name = whole_linear_kernel(wq_t, vnni, bias, rounding, backend)
    if name is None or not whole_linear_takes(x2):
        return None
    mod = kernels.get()
    if mod is None or x2.dim() != 2 or out_dtype not in _WHOLE_LINEAR_DTYPES:
        return None
    return getattr(mod, name)(x2.contiguous(), vnni, s_w, list(sizes), int_qmax(a_bits), out_dtype)


def whole_linear_kernel(wq_t: torch.Tensor, vnni: torch.Tensor | None, bias: torch.Tensor | None, rounding: str,
                        backend: str) -> str | None:
    """The kernel of :func:`whole_linear` for the module (fixed until its weights or backend change), or None: the
    packed weights of the ``amx`` backend with K padded to a multiple of 64 (``int8_linear_amx``) or of the ``avx2``
    backend (``int8_linear_avx2``), no bias, half-even activation rounding."""
    if vnni is None or bias is not None or rounding != "half_even":
        return None
    if backend == "amx" and wq_t.shape[0] % 64 == 0:
        return "int8_linear_amx"
    return "int8_linear_avx2" if backend == "avx2" else None


def whole_linear_takes(x: torch.Tensor) -> bool:
    """The conditions of :func:`whole_linear` on its input (its output has the input's dtype): a CPU tensor of a
    dtype the kernel reads, no autograd."""
    return x.device.type == "cpu" and not x.requires_grad and x.dtype in _WHOLE_LINEAR_DTYPES


def int8_gemm(q: torch.Tensor, s_a: torch.Tensor, wq_t: torch.Tensor, s_w: torch.Tensor, n_out: int,
              bias: torch.Tensor | None, out_dtype: torch.dtype, codes_f32: torch.Tensor | None = None,
              vnni: torch.Tensor | None = None, backend: str = "int_mm") -> torch.Tensor:
    """The GEMM and epilogue of :func:`int8_linear` for activation codes already quantized: q int8 [M, K],
    s_a fp32 [M, 1] -> [M, N] out_dtype."""
    acc32 = int8_accumulate(q, wq_t, codes_f32, vnni, backend)  # [M, Np]
    return epilogue_split(acc32, s_a, s_w, bias, (n_out,), out_dtype)[0]  # [M, N]


def fp8_linear(x2: torch.Tensor, wq: torch.Tensor, s_w: torch.Tensor, bias: torch.Tensor | None,
               a_granularity: str, w_granularity: str, out_dtype: torch.dtype) -> torch.Tensor:
    """x2 [M, K] float; wq e4m3 [N, K]; s_w [] / [N] / [nb, kb] -> [M, N] out_dtype, float64 accumulation."""
    n, k = wq.shape
    if w_granularity == "block128":
        # per K-block promotion (Triton w8a8_block_fp8_matmul): acc += dot(qa_blk, qw_blk) * a_s * w_s, fp32
        qa, s_a = P.quant_act_fp8_group(x2)  # [M, Kp] e4m3, [M, G]
        wp = P._pad_last2(wq.float(), P.BLOCK)  # [Np, Kp]
        g = qa.shape[-1] // P.BLOCK
        part = torch.einsum("mgb,ngb->mng", qa.double().unflatten(-1, (g, P.BLOCK)),
                            wp.double().unflatten(-1, (g, P.BLOCK))).float()  # [M, Np, G] exact per block
        s_wn = s_w.repeat_interleave(P.BLOCK, dim=0)  # [Np, G]
        acc = (part * s_a[:, None, :] * s_wn[None, :, :]).sum(-1)[:, :n]  # [M, N] fp32
        y = acc if bias is None else (acc.double() + bias.to(out_dtype).double()).float()
        return y.to(out_dtype)
    if a_granularity != "token":
        raise ValueError(f"QuantConfig.a_granularity={a_granularity!r} needs w_granularity='block128'; accepted: 'token'")
    qa, s_a = P.quant_act_fp8_token(x2)  # [M, K] e4m3, [M, 1]
    acc = (qa.double() @ wq.double().t()).float()  # [M, N]: exact sum of e4m3 products, then fp32
    sw = s_w.reshape(-1) if s_w.numel() > 1 else s_w.reshape(())  # [N] or []
    return epilogue(acc, s_a, sw, bias, out_dtype)


def _pack(w: torch.Tensor, qcfg: QuantConfig, amax: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize a [..., N, K] weight into the executor's storage: int8 -> transposed, padded [..., Kp, Np]
    and scale [..., N] / [..., 1]; fp8 -> e4m3 [..., N, K] and its scale."""
    q, s = P.quant_weight(w, qcfg, amax)
    if qcfg.w_format == "int8":
        q_t = P._pad_last2(q, 8).transpose(-1, -2).contiguous()  # [..., Kp, Np]
        return q_t, s.squeeze(-1)  # s: [..., N] (channel) or [..., 1] (tensor)
    return q.contiguous(), s


class QuantLinear(nn.Module):
    """A W8A8 ``nn.Linear`` replacement: weights quantized once per sync, activations per forward."""

    def __init__(self, linear: nn.Linear, qcfg: QuantConfig, amax: torch.Tensor | None = None,
                 int8_backend: str = "auto"):
        super().__init__()
        if not qcfg.quantizes_weights:
            raise ValueError("QuantLinear needs QuantConfig.w_format in ('int8', 'fp8_e4m3')")
        self.qcfg = qcfg
        self.int8_backend = resolve_int8_backend(int8_backend, linear.weight.device)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        q, s = _pack(linear.weight, qcfg, amax)
        self.register_buffer("weight_q", q)
        self.register_buffer("weight_scale", s)
        bias = None if linear.bias is None else linear.bias.detach().clone()
        self.register_buffer("bias", bias)
        register_backend_layouts(self, "weight", q, qcfg.w_format == "int8")

    @torch.no_grad()
    def requantize(self, weight: torch.Tensor, bias: torch.Tensor | None = None, amax: torch.Tensor | None = None):
        """Weight sync: recompute scales from ``weight`` and copy into the existing storage."""
        q, s = _pack(weight, self.qcfg, amax)
        self.weight_q.copy_(q)
        self.weight_scale.copy_(s)
        follow_backend_layouts(self, "weight", self.weight_q)
        if bias is not None and self.bias is not None:
            self.bias.copy_(bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, self.in_features)  # [M, K]
        if self.qcfg.w_format == "int8":
            y = int8_linear(x2, self.weight_q, self.weight_scale, self.out_features, self.bias,
                            self.qcfg.a_int8_rounding, x.dtype, self.weight_codes_f32, self.qcfg.a_bits,
                            self.weight_vnni, self.int8_backend)
        else:
            y = fp8_linear(x2, self.weight_q, self.weight_scale, self.bias, self.qcfg.a_granularity,
                           self.qcfg.w_granularity, x.dtype)
        return y.reshape(*x.shape[:-1], self.out_features)  # [..., N]

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, w={self.qcfg.w_format}/"
                f"{self.qcfg.w_granularity}, bias={self.bias is not None}, int8_backend={self.int8_backend}")


def _version(x: torch.Tensor) -> int | None:
    # an inference tensor (torch.inference_mode) has no version counter; asking raises, and a raised and caught
    # RuntimeError costs about 50 us: 0.25 s of a 4.5 s SmolLM2 decode of 32 tokens at batch 16 in the engine
    return None if x.is_inference() else x._version


class FusedQuantLinear(nn.Module):
    """int8 linears that read the same input, as one GEMM: q|k|v and gate|up (vLLM's ``QKVParallelLinear`` and
    ``MergedColumnParallelLinear``). One activation quantization, one ``_int_mm`` over the concatenated output
    rows, one epilogue, then each member's columns cast to the compute dtype as a contiguous tensor of its own.

    Bit for bit the members' own ``QuantLinear`` outputs: weights are quantized member by member (per output
    row, or with the group's shared per-tensor amax, which the executor already uses), the activation codes are
    those of the shared input, every accumulator element is the same exact int32 dot product, and the
    epilogue is element-wise (tested: ``tests/test_quant_fused.py``).

    The members stay in the model as :class:`FusedQuantSlice` modules under their own names, so the model's
    forward is untouched: the first member called with an input runs the group's GEMM and keeps the other
    members' outputs until they ask for them with the same tensor (identity; and its version counter where it
    has one: an inference tensor has none). A member called with another input, or twice, recomputes.
    Used for ``w_format='int8'`` only (fp8 ``block128`` scales are per 128x128 block of each member)."""

    def __init__(self, linears: dict[str, nn.Linear], qcfg: QuantConfig, amaxes: dict[str, torch.Tensor | None],
                 int8_backend: str = "auto"):
        super().__init__()
        if qcfg.w_format != "int8" or qcfg.w_granularity not in ("channel", "tensor"):
            raise ValueError(f"FusedQuantLinear needs w_format='int8' with 'channel' or 'tensor' granularity, got "
                             f"{qcfg.w_format!r} / {qcfg.w_granularity!r}")
        lins = list(linears.values())
        if len(lins) < 2 or not can_fuse(lins):
            raise ValueError("FusedQuantLinear needs two or more linears with the same in_features, dtype, device "
                             "and bias presence")
        self.qcfg = qcfg
        self.member_names = tuple(n.rpartition(".")[2] for n in linears)
        self.int8_backend = resolve_int8_backend(int8_backend, lins[0].weight.device)
        self.in_features = lins[0].in_features
        self.sizes = tuple(m.out_features for m in lins)
        self.out_features = sum(self.sizes)
        q, s = self._quantize([m.weight for m in lins], [amaxes.get(n) for n in linears])
        self.register_buffer("weight_q", q)  # [Kp, Np] int8
        self.register_buffer("weight_scale", s)  # [N] fp32
        bias = None if lins[0].bias is None else torch.cat([m.bias.detach() for m in lins])
        self.register_buffer("bias", bias)
        register_backend_layouts(self, "weight", q, True)
        self._memo = None

    def _quantize(self, weights, amaxes) -> tuple[torch.Tensor, torch.Tensor]:
        qs, ss = [], []
        for w, amax in zip(weights, amaxes):
            q, s = P.quant_weight(w, self.qcfg, amax)  # [N_i, K] int8, [N_i, 1] or [1, 1]
            qs.append(q)
            ss.append(s.reshape(-1).expand(q.shape[0]))  # [N_i]: a per-tensor scale repeated per row
        q = P._pad_last2(torch.cat(qs), 8).transpose(-1, -2).contiguous()  # [Kp, Np]
        return q, torch.cat(ss)

    @torch.no_grad()
    def requantize(self, weights: list[torch.Tensor], biases: list[torch.Tensor | None],
                   amaxes: list[torch.Tensor | None]) -> None:
        """Weight sync: the members' new weights (in ``member_names`` order), scales recomputed."""
        q, s = self._quantize(weights, amaxes)
        self.weight_q.copy_(q)
        self.weight_scale.copy_(s)
        follow_backend_layouts(self, "weight", self.weight_q)
        if self.bias is not None:
            self.bias.copy_(torch.cat([b.detach() for b in biases]))
        self._memo = None

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """x [..., K] -> one [..., N_i] tensor per member (contiguous, x's dtype)."""
        x2 = x.reshape(-1, self.in_features)  # [M, K]
        outs = whole_linear(x2, self.weight_q, self.weight_vnni, self.weight_scale, self.sizes, self.bias,
                            self.qcfg.a_int8_rounding, self.qcfg.a_bits, x.dtype, self.int8_backend)
        if outs is not None:
            return tuple(o.reshape(*x.shape[:-1], n) for o, n in zip(outs, self.sizes))
        q, s_a = quant_act_int8(x2, self.qcfg.a_int8_rounding, self.qcfg.a_bits)  # [M, K], [M, 1]
        acc = int8_accumulate(q, self.weight_q, self.weight_codes_f32, self.weight_vnni, self.int8_backend)  # [M, Np]
        outs = epilogue_split(acc, s_a, self.weight_scale, self.bias, self.sizes, x.dtype)  # [M, N_i] each
        return tuple(o.reshape(*x.shape[:-1], n) for o, n in zip(outs, self.sizes))

    def member_output(self, index: int, x: torch.Tensor) -> torch.Tensor:
        memo = self._memo
        if memo is None or memo[0] is not x or memo[1] != _version(x) or memo[2][index] is None:
            memo = self._memo = [x, _version(x), list(self(x))]
        out, memo[2][index] = memo[2][index], None  # each output is handed out once
        if all(o is None for o in memo[2]):
            self._memo = None  # every member served: release the input and outputs
        return out

    def extra_repr(self) -> str:
        return (f"members={self.member_names}, in_features={self.in_features}, out_features={self.sizes}, "
                f"w={self.qcfg.w_format}/{self.qcfg.w_granularity}, bias={self.bias is not None}, "
                f"int8_backend={self.int8_backend}")


def can_fuse(linears: list[nn.Linear]) -> bool:
    """Linears whose GEMMs can run as one: same input width, dtype, device, and all or none with a bias."""
    a = linears[0]
    return all(m.in_features == a.in_features and m.weight.dtype == a.weight.dtype
               and m.weight.device == a.weight.device and (m.bias is None) == (a.bias is None) for m in linears)


class FusedQuantSlice(nn.Module):
    """A member of a :class:`FusedQuantLinear` (``q_proj``, ``k_proj``, ``gate_proj``...), left in the model under
    its own name: its forward returns its columns of the group's GEMM."""

    def __init__(self, group: FusedQuantLinear, index: int):
        super().__init__()
        object.__setattr__(self, "group", group)  # not a submodule: the group is registered once, at the parent
        self.index = index
        self.in_features, self.out_features = group.in_features, group.sizes[index]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.group.member_output(self.index, x)

    def extra_repr(self) -> str:
        return f"{self.group.member_names[self.index]} of the fused group, out_features={self.out_features}"


def is_fused_experts(module: nn.Module) -> bool:
    """transformers 5.x MoE experts stored as fused 3-D parameters (Qwen3-MoE, Qwen2-MoE, Mixtral...):
    ``gate_up_proj`` [E, 2I, H] and ``down_proj`` [E, H, I], called as (hidden, top_k_index, top_k_weights)."""
    gu, dn = getattr(module, "gate_up_proj", None), getattr(module, "down_proj", None)
    return isinstance(gu, nn.Parameter) and isinstance(dn, nn.Parameter) and gu.dim() == 3 and dn.dim() == 3


def check_experts_layout(module: nn.Module) -> None:
    for attr, ok in (("has_bias", False), ("is_transposed", False), ("is_concatenated", True), ("has_gate", True)):
        if getattr(module, attr, ok) != ok:
            raise NotImplementedError(
                f"{type(module).__name__}: experts with {attr}={getattr(module, attr)} are not supported "
                f"(supported: {attr}={ok}, the Qwen3-MoE layout)")


def experts_loop(hidden: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor, num_experts: int,
                 act_fn, gate_up, down) -> torch.Tensor:
    """The eager transformers experts loop with the per-expert GEMMs given as callables
    ``gate_up(e, x) -> [n, 2I]`` and ``down(e, h) -> [n, H]``. hidden [T, H], top_k_* [T, k]."""
    out = torch.zeros_like(hidden)  # [T, H]
    with torch.no_grad():
        mask = nn.functional.one_hot(top_k_index, num_classes=num_experts + 1).permute(2, 1, 0)  # [E+1, k, T]
        hit = torch.greater(mask.sum(dim=(-1, -2)), 0).nonzero()
    for e in hit:
        e = int(e[0])
        if e == num_experts:
            continue
        pos, tok = torch.where(mask[e])
        g, u = gate_up(e, hidden[tok]).chunk(2, dim=-1)  # [n, I] each
        h = down(e, act_fn(g) * u)  # [n, H]
        h = h * top_k_weights[tok, pos, None]
        out.index_add_(0, tok, h.to(out.dtype))
    return out


class QuantExperts(nn.Module):
    """W8A8 fused MoE experts: per expert, per output channel (or per expert tensor) weight scales,
    per-token dynamic activations, the same kernels as ``QuantLinear``."""

    def __init__(self, experts: nn.Module, qcfg: QuantConfig, int8_backend: str = "auto"):
        super().__init__()
        check_experts_layout(experts)
        self.qcfg = qcfg
        self.int8_backend = resolve_int8_backend(int8_backend, experts.gate_up_proj.device)
        self.num_experts = experts.gate_up_proj.shape[0]
        self.act_fn = experts.act_fn
        self.gu_shape = tuple(experts.gate_up_proj.shape)  # [E, 2I, H]
        self.dn_shape = tuple(experts.down_proj.shape)  # [E, H, I]
        for name in ("gate_up_proj", "down_proj"):
            q, s = _pack(getattr(experts, name), qcfg, None)
            self.register_buffer(f"{name}_q", q)
            self.register_buffer(f"{name}_scale", s)
            register_backend_layouts(self, name, q, qcfg.w_format == "int8")

    @torch.no_grad()
    def requantize(self, experts: nn.Module):
        for name in ("gate_up_proj", "down_proj"):
            q, s = _pack(getattr(experts, name), self.qcfg, None)
            getattr(self, f"{name}_q").copy_(q)
            getattr(self, f"{name}_scale").copy_(s)
            follow_backend_layouts(self, name, q)

    def _gemm(self, name: str, n_out: int, e: int, x: torch.Tensor) -> torch.Tensor:
        wq, s = getattr(self, f"{name}_q")[e], getattr(self, f"{name}_scale")[e]
        if self.qcfg.w_format == "int8":
            codes, packed = getattr(self, f"{name}_codes_f32"), getattr(self, f"{name}_vnni")
            return int8_linear(x, wq, s, n_out, None, self.qcfg.a_int8_rounding, x.dtype,
                               None if codes is None else codes[e], self.qcfg.a_bits,
                               None if packed is None else packed[e], self.int8_backend)
        return fp8_linear(x, wq, s, None, self.qcfg.a_granularity, self.qcfg.w_granularity, x.dtype)

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor):
        return experts_loop(hidden_states, top_k_index, top_k_weights, self.num_experts, self.act_fn,
                            lambda e, x: self._gemm("gate_up_proj", self.gu_shape[1], e, x),
                            lambda e, x: self._gemm("down_proj", self.dn_shape[1], e, x))

    def extra_repr(self) -> str:
        return f"num_experts={self.num_experts}, gate_up={self.gu_shape}, down={self.dn_shape}, w={self.qcfg.w_format}"
