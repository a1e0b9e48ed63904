"""Seventeenth session: a prefill's bf16 linears (SmolLM2-135M's shapes, 656 = 16 x 41 rows as in bench_engine's
multi-turn episodes, and 2,048 rows) through F.linear (the weight reordered at every call) and through the weight
packed once (PackedBf16Linear's product), per call, interleaved, medians. Usage: packed_prefill_speed.py [THREADS]"""
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from interq.machine import describe, machine_info
from interq.quant.packed_linear import _pack

threads = int(sys.argv[1]) if len(sys.argv) > 1 else 2
torch.set_num_threads(threads)
print(describe(machine_info()), flush=True)
g = torch.Generator().manual_seed(0)
for m in (656, 2048):
    tot = {"F.linear": 0.0, "packed": 0.0}
    for k, n in [(576, 576), (576, 192), (576, 1536), (1536, 576)]:
        w = (torch.randn(n, k, generator=g) / k ** 0.5).bfloat16()
        pw = _pack(w)
        x = torch.randn(m, k, generator=g).bfloat16()
        fs = {"F.linear": lambda: F.linear(x, w), "packed": lambda: torch.ops.mkldnn._linear_pointwise(x, pw, None, "none", [], "")}
        res = {k_: [] for k_ in fs}
        with torch.inference_mode():
            for r in range(7):
                for name, f in fs.items():
                    t = time.perf_counter()
                    for _ in range(10):
                        f()
                    res[name].append((time.perf_counter() - t) / 10 * 1e3)
        med = {k_: statistics.median(v) for k_, v in res.items()}
        per_layer = {"576x576": 2, "576x192": 2, "576x1536": 2, "1536x576": 1}[f"{k}x{n}"]
        for k_ in tot:
            tot[k_] += per_layer * med[k_]
        print(f"M={m} K={k} N={n}: F.linear {med['F.linear']:.3f} ms, packed {med['packed']:.3f} ms, "
              f"ratio {med['F.linear'] / med['packed']:.2f}x", flush=True)
    print(f"M={m} one decoder layer's 7 linears: F.linear {tot['F.linear']:.2f} ms, packed {tot['packed']:.2f} ms, "
          f"ratio {tot['F.linear'] / tot['packed']:.2f}x", flush=True)
