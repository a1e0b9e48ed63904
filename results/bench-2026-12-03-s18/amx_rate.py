"""Eighteenth session: the AMX kernels' rates at prefill shapes on one thread, side by side in one run: interq's
AMX-BF16 product, its AMX-INT8 GEMM, and F.linear (oneDNN) in bf16. Usage: amx_rate.py [THREADS]"""
import sys
import time

import torch

from interq.machine import describe, machine_info
from interq.quant import kernels
from interq.quant import packed_linear as pl
from interq.quant.linear import vnni_pack

torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
print(describe(machine_info()), flush=True)
mod = kernels.load()


def hot(f, n=10):
    f()
    best = 1e9
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(n):
            f()
        best = min(best, (time.perf_counter() - t) / n)
    return best


for m, k, n in [(656, 1536, 576), (656, 576, 1536), (2048, 576, 1536)]:
    x = torch.randn(m, k).bfloat16()
    w = (torch.randn(n, k) * .05).bfloat16()
    p = pl.pack_bf16_amx(w)
    a = hot(lambda: mod.bf16_linear_amx(x, p, n, None, 0))
    xq = torch.randint(-127, 127, (m, k), dtype=torch.int8)
    pv = vnni_pack(torch.randint(-127, 127, (k, n), dtype=torch.int8))
    b = hot(lambda: mod.int8_gemm_amx(xq, pv, n))
    f = hot(lambda: torch.nn.functional.linear(x, w))
    ops = 2 * m * k * n
    print(f"{m} x {k} x {n}: AMX-BF16 {ops / a / 1e12:.2f} TFLOPS, AMX-INT8 {ops / b / 1e12:.2f} TOPS, "
          f"F.linear bf16 {ops / f / 1e12:.2f} TFLOPS")
