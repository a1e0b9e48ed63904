"""tests/ulps.py's bound: one bf16 step apart passes at one ulp, two steps fail; the gap follows the magnitude."""

from __future__ import annotations

import pytest
import torch
from ulps import assert_within_ulps, spacing


def test_spacing_is_the_gap_between_neighbouring_values():
    x = torch.tensor([1.0, 1.5, 3.0, -0.3, 1000.0]).bfloat16()
    gap = spacing(x, torch.bfloat16).float()
    assert torch.equal((x.float() + gap).bfloat16().float() - x.float(), gap)  # x + gap is the next bf16 value
    assert torch.equal((x.float() + gap / 4).bfloat16(), x)  # a quarter gap rounds back to x


def test_one_step_passes_two_fail():
    x = torch.linspace(-50, 50, 1001).bfloat16().float()
    step = spacing(x, torch.bfloat16).float()
    assert_within_ulps(x + step, x, torch.bfloat16, ulps=1)
    with pytest.raises(AssertionError, match="differ by more than 1 ulp"):
        assert_within_ulps(x + 2 * step, x, torch.bfloat16, ulps=1)


def test_nans_and_infinities_must_match():
    a = torch.tensor([1.0, float("nan"), float("inf")])
    assert_within_ulps(a, a.clone(), torch.float32)
    with pytest.raises(AssertionError, match="NaN"):
        assert_within_ulps(a, torch.tensor([1.0, 2.0, float("inf")]), torch.float32)
    with pytest.raises(AssertionError, match="infinities"):
        assert_within_ulps(a, torch.tensor([1.0, float("nan"), float("-inf")]), torch.float32)
