"""Sixteenth session (Intel Xeon with AMX): the exact int8 GEMM of one SmolLM2-135M layer (q|k|v, o, gate|up, down)
by each way this project computes it, at the row counts of decode (1-16), of batched decode and of multi-turn
prefill (up to ~2k rows), plus torch's bf16 F.linear for scale. Times are medians of repeated calls with the
weights in cache as they are after a warm-up; threads from argv[1] (default 1). Usage: gemm_amx.py [THREADS]"""
import json
import sys
import time

import torch

from interq.machine import machine_info
from interq.quant import kernels
from interq.quant.linear import int_mm_padded, vnni_pack


def med(fn, reps):
    fn()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return sorted(ts)[len(ts) // 2]


def main():
    threads = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    torch.set_num_threads(threads)
    mod = kernels.load()
    assert mod.has_int8_gemm_amx(), "no AMX here"
    SHAPES = {"qkv": (576, 960), "o": (576, 576), "gate_up": (576, 3072), "down": (1536, 576)}  # (K, N)
    g = torch.Generator().manual_seed(0)
    W = {k: torch.randint(-127, 128, s, dtype=torch.int8, generator=g) for k, s in SHAPES.items()}
    P = {k: vnni_pack(w) for k, w in W.items()}
    B = {k: w.t().contiguous().to(torch.bfloat16) for k, w in W.items()}  # [N, K]

    rows = []
    info = machine_info()
    print(f"threads {threads}; {info.get('cpu')}; class {info.get('cpu_class')}; load {info.get('load_avg_start')}")
    print(f"{'M':>5} {'amx ms':>8} {'vnni ms':>8} {'int_mm ms':>9} {'bf16 ms':>8} {'amx GOPS':>9} {'vnni/amx':>8} {'int_mm/amx':>10} {'bf16/amx':>8}")
    for m in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 1920):
        A = {k: torch.randint(-128, 128, (m, s[0]), dtype=torch.int8, generator=g) for k, s in SHAPES.items()}
        X = {k: a.to(torch.bfloat16) for k, a in A.items()}
        for k in SHAPES:  # exactness on the way
            assert torch.equal(mod.int8_gemm_amx(A[k], P[k], SHAPES[k][1]), int_mm_padded(A[k], W[k]))
        reps = max(5, min(200, int(2e4 / m)))
        t = {"amx": med(lambda: [mod.int8_gemm_amx(A[k], P[k], SHAPES[k][1]) for k in SHAPES], reps),
             "vnni": med(lambda: [mod.int8_gemm_vnni(A[k], P[k], SHAPES[k][1]) for k in SHAPES], reps),
             "int_mm": med(lambda: [torch._int_mm(A[k], W[k]) for k in SHAPES], max(3, reps // 4)),
             "bf16": med(lambda: [torch.nn.functional.linear(X[k], B[k]) for k in SHAPES], reps)}
        ops = 2 * m * sum(k * n for k, n in SHAPES.values())
        row = {"m": m, **{f"{k}_ms": v * 1e3 for k, v in t.items()}, "amx_gops": ops / t["amx"] / 1e9}
        rows.append(row)
        print(f"{m:>5} {t['amx']*1e3:>8.3f} {t['vnni']*1e3:>8.3f} {t['int_mm']*1e3:>9.3f} {t['bf16']*1e3:>8.3f} "
              f"{row['amx_gops']:>9.0f} {t['vnni']/t['amx']:>8.2f} {t['int_mm']/t['amx']:>10.2f} {t['bf16']/t['amx']:>8.2f}")
    info = machine_info()
    print("RESULT " + json.dumps({"threads": threads, "rows": rows, "load_avg_end": info.get("load_avg_start"),
                                  "cpu": info.get("cpu"), "cpu_class": info.get("cpu_class")}))


if __name__ == "__main__":
    main()
