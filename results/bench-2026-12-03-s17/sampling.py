"""Seventeenth session: the sampler's draw (interq.rollout.sampling) for SmolLM2's vocabulary (49,152), 16 rows, with
the uniforms from interq's kernel (uniform_f64_rows) and from torch's uniform_ in Python threads (the fallback),
interleaved, medians; the same numbers checked. Usage: sampling.py [THREADS]"""
import statistics
import sys
import time

import torch

from interq.machine import describe, machine_info
from interq.quant import kernels
from interq.rollout.sampling import SamplingParams, exponential_race, sample_tokens

threads = int(sys.argv[1]) if len(sys.argv) > 1 else 2
torch.set_num_threads(threads)
print(describe(machine_info()), flush=True)
kernels.load()
V, N = 49152, 16
logits = torch.randn(N, V)
params = SamplingParams()


def timed(f, n=20):
    t = time.perf_counter()
    for _ in range(n):
        f()
    return (time.perf_counter() - t) / n * 1e3


with torch.inference_mode():
    res = {}
    for r in range(7):
        for path in ("threads", "kernel"):
            kernels.set_enabled(path == "kernel")
            gens = [torch.Generator().manual_seed(i) for i in range(N)]
            res.setdefault(("race", path), []).append(timed(lambda: exponential_race(gens, V)))
            res.setdefault(("sample_tokens", path), []).append(timed(lambda: sample_tokens(logits, params, gens)))
            g1 = [torch.Generator().manual_seed(i) for i in range(N)]
            res.setdefault(("one row's uniforms", path), []).append(
                timed(lambda: exponential_race(g1[:1], V)))
    kernels.set_enabled(True)
    a = exponential_race([torch.Generator().manual_seed(i) for i in range(N)], V)
    kernels.set_enabled(False)
    b = exponential_race([torch.Generator().manual_seed(i) for i in range(N)], V)
    kernels.set_enabled(True)
for what in ("race", "sample_tokens", "one row's uniforms"):
    t, k = statistics.median(res[(what, "threads")]), statistics.median(res[(what, "kernel")])
    print(f"{what:20s} ({N if what != 'one row' else 1} x {V}): threads {t:.2f} ms, kernel {k:.2f} ms, ratio {t / k:.2f}x")
print(f"same numbers: {torch.equal(a, b)}")
