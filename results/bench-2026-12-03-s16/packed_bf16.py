"""Sixteenth session (Intel Xeon with AMX): bf16 linear layers by F.linear (oneDNN reorders the weight at every call)
and by PackedBf16Linear (the weight packed once), SmolLM2-135M's lm_head (49,152 x 576) and one decoder layer's four
GEMMs (q|k|v as three linears of the bf16 executor: 576 -> 576, 192, 192; o; gate, up; down), medians of repeated
calls, bit equality checked on the way. Usage: packed_bf16.py [THREADS]"""
import json
import sys

import torch
from torch import nn

from interq.machine import describe, load_avg, machine_info
from interq.quant.packed_linear import PackedBf16Linear

from gemm_amx import med  # this folder's timer (the script's folder is on sys.path)

threads = int(sys.argv[1]) if len(sys.argv) > 1 else 1
torch.set_num_threads(threads)
print(describe(machine_info()), flush=True)
g = torch.Generator().manual_seed(0)


def lin(k, n):
    m = nn.Linear(k, n, bias=False).requires_grad_(False)
    m.weight.copy_(torch.randn(n, k, generator=g) * 0.02)
    return m.to(torch.bfloat16)


SETS = {"lm_head": [(576, 49152)],
        "layer": [(576, 576), (576, 192), (576, 192), (576, 576), (576, 1536), (576, 1536), (1536, 576)]}
rows = []
print(f"{'GEMMs':>8} {'M':>4} {'F.linear ms':>12} {'packed ms':>10} {'speed-up':>9} {'same bits':>9}")
for name, shapes in SETS.items():
    plain = [lin(k, n) for k, n in shapes]
    packed = [PackedBf16Linear.from_linear(m) for m in plain]
    for m in (1, 16, 64, 256):
        xs = [torch.randn(m, k, generator=g).to(torch.bfloat16) for k, _ in shapes]
        same = all(torch.equal(p(x), nn.functional.linear(x, q.weight)) for p, q, x in zip(packed, plain, xs))
        a = med(lambda: [nn.functional.linear(x, q.weight) for q, x in zip(plain, xs)], 20) * 1e3
        b = med(lambda: [p(x) for p, x in zip(packed, xs)], 20) * 1e3
        rows.append({"gemms": name, "m": m, "f_linear_ms": round(a, 3), "packed_ms": round(b, 3),
                     "speedup": round(a / b, 3), "same_bits": same})
        print(f"{name:>8} {m:>4} {a:>12.3f} {b:>10.3f} {a / b:>9.2f} {str(same):>9}", flush=True)
info = machine_info()
info["load_avg_end"] = load_avg()
print("RESULT " + json.dumps({"threads": threads, "rows": rows, "machine": info}))
