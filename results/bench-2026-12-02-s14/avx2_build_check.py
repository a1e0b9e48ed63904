"""The CPU kernels built for an AVX2 + FMA CPU without AVX-512 (-march=haswell instead of -march=native: the code an
AVX2-class machine compiles), loaded on this machine and put through the kernels' tests: the learner's attention
kernel (its 256-bit FMA path), the executor's bit-exact kernels and the decode-attention kernel. Fourteenth session.
    .venv/bin/python results/bench-2026-12-02-s14/avx2_build_check.py"""
import sys

import pytest

from interq.quant import kernels

kernels._FLAGS = [f if f != "-march=native" else "-march=haswell" for f in kernels._FLAGS]
mod = kernels.load(verbose=False)
print("build:", kernels.status(), flush=True)
assert mod is not None and not mod.has_int8_gemm_vnni(), "expected an AVX2 build (no AVX-512 VNNI GEMM)"
sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", "tests/test_train_learner_attention.py",
                      "tests/test_quant_kernels.py", "tests/test_rollout_attention.py", *sys.argv[1:]]))
