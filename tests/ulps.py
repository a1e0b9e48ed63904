"""Comparing two different float computations of one quantity within a bound derived from the dtype's rounding.

Two kernels that sum in different orders (oneDNN's AMX, AVX-512 and AVX2 paths, a batched against a plain matmul,
a blocked against an unblocked attention) are each exact up to rounding but not to the bit, and which ones agree bit
for bit depends on the CPU class. Where a test compares two such computations it asks for agreement within a few
units in the last place of the output dtype, measured at the magnitude of the values themselves:

    |a - b| <= ulps * spacing(max(|a|, |b|)) + floor,    spacing(x) = eps(dtype) * 2 ** floor(log2 |x|)

``spacing`` is the gap between consecutive values of ``dtype`` at |x| (eps is the gap at 1: 2^-7 for bf16, 2^-23
for fp32). Both operands rounded once from higher-precision results that differ by much less than that gap can
differ by at most one gap. ``floor`` covers values near zero (cancellation), where the higher-precision error of the
accumulation, not the output's rounding, decides; pass it relative to the data's scale, e.g.
``eps(float32) * K * max|x| * max|w|`` for a K-long fp32 dot product.
"""

from __future__ import annotations

import torch


def spacing(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The gap between consecutive ``dtype`` values at |x| (float64; the smallest normal's gap below it)."""
    fi = torch.finfo(dtype)
    mag = x.detach().double().abs().clamp_min(fi.tiny)
    return fi.eps * torch.exp2(torch.floor(torch.log2(mag)))


def assert_within_ulps(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype | None = None,
                       ulps: float = 1.0, floor: float = 0.0, msg: str = "") -> None:
    """Every element of ``actual`` within ``ulps`` gaps of ``dtype`` (default: ``expected``'s dtype) of ``expected``
    at the larger of the two magnitudes, plus ``floor``; NaN where the other is NaN, infinities equal."""
    dtype = dtype or expected.dtype
    assert actual.shape == expected.shape, f"{msg} shapes differ: {tuple(actual.shape)} vs {tuple(expected.shape)}"
    a, b = actual.detach().double(), expected.detach().double()
    nan = a.isnan() | b.isnan()
    assert torch.equal(a.isnan(), b.isnan()), f"{msg} NaN in one and not the other at {int((a.isnan() ^ b.isnan()).sum())} places"
    inf = a.isinf() | b.isinf()
    assert torch.equal(a[inf], b[inf]), f"{msg} infinities differ"
    fin = ~(nan | inf)
    a, b = a[fin], b[fin]
    if a.numel() == 0:
        return
    bound = ulps * spacing(torch.maximum(a.abs(), b.abs()), dtype) + floor
    over = (a - b).abs() > bound
    if over.any():
        i = int(((a - b).abs() - bound).argmax())
        raise AssertionError(f"{msg} {int(over.sum())} of {a.numel()} values differ by more than {ulps} ulp(s) of "
                             f"{dtype} (+{floor:g}): worst {a[i].item()!r} vs {b[i].item()!r} (bound {bound[i].item():g})")
