"""The executor's int8 accumulator stays exact where ``torch._int_mm`` is not.

On a CPU with AVX512-VNNI torch hands ``_int_mm`` to oneDNN; capped below VNNI (``ONEDNN_MAX_CPU_ISA=AVX2``, as one
sets to mimic an older CPU) oneDNN sums pairs of int8 products in saturating int16 and the int32 result is wrong
wherever two products are large. interq then never chooses a backend that calls ``_int_mm``, and refuses one asked for
by name, saying why.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from interq.quant import linear
from interq.quant.linear import EXACT_WITHOUT_INT_MM, int_mm_exact, resolve_int8_backend


@pytest.fixture
def inexact_int_mm(monkeypatch):
    """This process's probe answer replaced by 'not exact' (the test's own: restored after)."""
    monkeypatch.setitem(linear._INT_MM_EXACT, "v", (False, "a test says torch._int_mm is not exact"))


def test_the_probe_answers_what_a_direct_check_of_extreme_codes_finds():
    a = torch.full((16, 64), 127, dtype=torch.int8)  # every pair of products 2 * 127 * 127 (+ oneDNN's offset)
    w = torch.full((64, 32), 127, dtype=torch.int8)
    direct = torch.equal(torch._int_mm(a, w), (a.double() @ w.double()).to(torch.int32))
    ok, why = int_mm_exact()
    assert ok == direct
    assert (why == "exact") == ok


def test_auto_avoids_int_mm_and_named_int_mm_backends_are_refused_where_it_is_not_exact(inexact_int_mm):
    assert resolve_int8_backend("auto") in EXACT_WITHOUT_INT_MM
    assert resolve_int8_backend("fp32_exact") == "fp32_exact"
    for name in ("int_mm", "vnni", "amx"):
        with pytest.raises(ValueError, match=rf"int8_backend='{name}' cannot run here") as err:
            resolve_int8_backend(name)
        assert "fp32_exact" in str(err.value) and "avx2" in str(err.value)
    assert resolve_int8_backend("auto", torch.device("cuda")) == "int_mm"  # a CUDA _int_mm is not oneDNN's


_CHILD = r"""
import json, torch
from interq import kernels
from interq.quant.linear import int8_accumulate, int_mm_exact, register_backend_layouts, resolve_int8_backend
from torch import nn

kernels.load()
backend = resolve_int8_backend("auto")
g = torch.Generator().manual_seed(1)
out = {"backend": backend, "exact_probe": int_mm_exact()[0], "rows": {}}
for m in (1, 16, 300):  # decode rows, and more than the vnni kernel takes itself
    q = torch.where(torch.rand(m, 512, generator=g) < 0.5, -128, 127).to(torch.int8)
    w = torch.where(torch.rand(512, 96, generator=g) < 0.5, -128, 127).to(torch.int8)
    holder = nn.Module()
    holder.int8_backend = backend
    register_backend_layouts(holder, "w", w, True)
    acc = int8_accumulate(q, w, holder.w_codes_f32, holder.w_vnni, backend)
    out["rows"][m] = torch.equal(acc, (q.double() @ w.double()).to(torch.int32))
print("RESULT " + json.dumps(out))
"""


@pytest.mark.slow  # a fresh interpreter that loads torch and the kernels
def test_the_auto_backend_sums_extreme_codes_exactly_with_onednn_capped_below_vnni():
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2"}
    done = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    res = json.loads(line[len("RESULT "):])
    assert all(res["rows"].values()), res
    if not res["exact_probe"]:
        assert res["backend"] in EXACT_WITHOUT_INT_MM, res
