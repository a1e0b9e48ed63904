"""Eighteenth session: the bf16 executor's linears of one SmolLM2-135M decode step (every PackedBf16Linear once, at
ROWS rows; weights streamed from memory as in the engine) with the AMX-BF16 product off (oneDNN's packed product)
and on, alternated, and per shape in a hot loop (weights cached). Usage: decode_linears.py [THREADS] [ROWS]"""
import sys
import time

import torch

from interq.machine import describe, machine_info
from interq.models.pretrained import load_smollm2
from interq.quant import BF16_EXECUTOR, make_executor
from interq.quant import packed_linear as pl

threads = int(sys.argv[1]) if len(sys.argv) > 1 else 2
rows = int(sys.argv[2]) if len(sys.argv) > 2 else 16
torch.set_num_threads(threads)
print(describe(machine_info()), flush=True)
exe = make_executor(load_smollm2(torch.bfloat16)[0], BF16_EXECUTOR)
mods = [m for m in exe.modules() if isinstance(m, pl.PackedBf16Linear)]
ins = {m: torch.randn(rows, m.in_features).bfloat16() for m in mods}
res = {False: [], True: []}
with torch.no_grad():
    for r in range(6):
        for on in (False, True):
            pl.use_amx_product(on)
            for m in mods:
                m(ins[m])
            t = time.perf_counter()
            for _ in range(5):
                for m in mods:
                    m(ins[m])
            res[on].append((time.perf_counter() - t) / 5 * 1e3)
    print("choices:", {k[:4]: v for k, v in pl._CHOICES.items() if k[3] == rows})
    for on in (False, True):
        print(f"amx {'on ' if on else 'off'}: {len(mods)} linears per step {min(res[on]):.1f} ms (min of 6; all "
              f"{', '.join(f'{v:.1f}' for v in res[on])})")
    print(f"step's linears: {min(res[False]) / min(res[True]):.2f}x with the AMX product")

    def hot(f, n=30):
        f()
        best = 1e9
        for _ in range(5):
            t = time.perf_counter()
            for _ in range(n):
                f()
            best = min(best, (time.perf_counter() - t) / n)
        return best * 1e3

    for k, n in sorted({(m.in_features, m.out_features) for m in mods}):
        m = next(m for m in mods if (m.in_features, m.out_features) == (k, n))
        x = ins[m]
        pl.use_amx_product(False)
        a = hot(lambda: m(x))
        pl.use_amx_product(True)
        b = hot(lambda: m(x))
        f = hot(lambda: torch.nn.functional.linear(x, m.weight))
        print(f"{k} x {n}, {rows} rows (hot): F.linear {f:.3f} ms, oneDNN packed {a:.3f}, AMX {b:.3f} ({a / b:.2f}x)")
