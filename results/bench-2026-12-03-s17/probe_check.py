"""Seventeenth session: PackedBf16Linear's probe (interq.quant.packed_linear.packed_product_matches) against the
products on random inputs, 1 and 2 threads, for cases where packed_rows_grid.log saw the two paths agree or differ:
the verdict, and how many outputs differ on five random draws. Usage: probe_check.py"""
import time

import torch
import torch.nn.functional as F

from interq.machine import describe, machine_info
from interq.quant import packed_linear as pl

print(describe(machine_info()), flush=True)
for threads in (1, 2):
    torch.set_num_threads(threads)
    for k, n, bias, m in [(576, 192, False, 96), (576, 192, True, 96), (576, 576, False, 300), (576, 576, False, 200),
                          (576, 1536, False, 656), (1536, 576, False, 342), (576, 49152, False, 16)]:
        t = time.perf_counter()
        verdict = pl.packed_product_matches(k, n, bias, m)
        ms = (time.perf_counter() - t) * 1e3
        g = torch.Generator().manual_seed(5)
        w = torch.randn(n, k, generator=g).bfloat16()
        pw = pl._pack(w)
        b = torch.randn(n, generator=g).bfloat16() if bias else None
        diffs, outputs = 0, 0
        for _ in range(5 if n < 10000 else 1):
            x = torch.randn(m, k, generator=g).bfloat16()
            diffs += int((pl._packed_product(x, pw, b) != F.linear(x, w, b)).sum())
            outputs += m * n
        print(f"threads {threads} K={k} N={n} bias={bias} rows={m}: probe says {'same' if verdict else 'DIFFERENT'} "
              f"({ms:.0f} ms); random inputs: {diffs} of {outputs} outputs differ", flush=True)
