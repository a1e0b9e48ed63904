"""Eighteenth session: one SmolLM2-135M decoder layer's seven linears (q, k, v, o, gate, up, down) at prefill row
counts: F.linear against the AMX-BF16 product with the K blocking the probe finds (where one gives F.linear's bits;
'-' where none does), hot weights, alternated, min of 5. Usage: prefill_rows.py [THREADS]"""
import sys
import time

import torch

from interq.machine import describe, machine_info
from interq.quant import packed_linear as pl

torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
print(describe(machine_info()), flush=True)
shapes = [(576, 576), (576, 192), (576, 192), (576, 576), (576, 1536), (576, 1536), (1536, 576)]
ws = {s: (torch.randn(s[1], s[0]) * 0.05).bfloat16() for s in set(shapes)}
packed = {s: pl.pack_bf16_amx(w) for s, w in ws.items()}


def hot(f, n=5):
    f()
    best = 1e9
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(n):
            f()
        best = min(best, (time.perf_counter() - t) / n)
    return best * 1e3


for rows in (64, 128, 256, 384, 512, 656, 800, 1024, 1536, 2048):
    xs = {k: torch.randn(rows, k).bfloat16() for k in (576, 1536)}
    t0 = time.perf_counter()
    choice = {s: pl.product_choice(s[0], s[1], False, rows) for s in set(shapes)}
    probe_s = time.perf_counter() - t0
    tf = ta = 0.0
    amx_all = True
    for s in shapes:
        x, w = xs[s[0]], ws[s]
        f = hot(lambda: torch.nn.functional.linear(x, w))
        product, kb = choice[s]
        a = hot(lambda: pl._amx_product(x, packed[s], s[1], None, kb)) if product == "amx" else f
        amx_all &= product == "amx"
        tf, ta = tf + f, ta + a
    print(f"{rows:5d} rows: F.linear {tf:6.2f} ms, AMX where it matches {ta:6.2f} ms ({tf / ta:.2f}x); choices "
          f"{ {f'{k}x{n}': c for (k, n), c in choice.items()} }; probing {probe_s * 1e3:.0f} ms", flush=True)
