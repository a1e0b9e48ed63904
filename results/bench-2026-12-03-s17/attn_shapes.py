"""Seventeenth session: SmolLM2's attention at bench_engine's multi-turn shapes (16 rows, 9 query / 3 KV heads, head
64, bf16, left-padded masks): torch's flash kernel (sdpa_packed) against interq's kernels (packed_kernel), decode
(1 new token) and observation prefill (41 new tokens), per call, interleaved, medians. Usage: attn_shapes.py [THREADS]"""
import statistics
import sys
import time

import torch

from interq.machine import describe, machine_info
from interq.quant import kernels
from interq.rollout.attention import packed_kernel_attention, sdpa_packed_attention

threads = int(sys.argv[1]) if len(sys.argv) > 1 else 2
torch.set_num_threads(threads)
print(describe(machine_info()), flush=True)
kernels.load()


class M:
    num_key_value_groups = 3


def case(q_len, ctx, b=16):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(b, 9, q_len, 64, generator=g).bfloat16()
    k = torch.randn(b, 3, ctx, 64, generator=g).bfloat16()
    v = torch.randn(b, 3, ctx, 64, generator=g).bfloat16()
    keep = torch.ones(b, ctx, dtype=torch.bool)
    for i in range(b):
        keep[i, : (i * 7) % 20] = False  # some padding per row
    causal = torch.ones(q_len, ctx, dtype=torch.bool).tril(ctx - q_len)
    mask = (keep[:, None, None, :] & causal[None, None]).contiguous()  # [B, 1, q, K]
    return q, k, v, mask


def timeit(f, n):
    t = time.perf_counter()
    for _ in range(n):
        f()
    return (time.perf_counter() - t) / n * 1e3


with torch.inference_mode():
    for q_len in (1, 41):
        for ctx in (100, 250, 500):
            q, k, v, mask = case(q_len, ctx)
            fs = {"sdpa_packed": lambda: sdpa_packed_attention(M, q, k, v, mask, scaling=0.125),
                  "packed_kernel": lambda: packed_kernel_attention(M, q, k, v, mask, scaling=0.125)}
            a, b_ = fs["sdpa_packed"]()[0].float(), fs["packed_kernel"]()[0].float()
            res = {n: [] for n in fs}
            n = 200 if q_len == 1 else 30
            for r in range(5):
                for name, f in fs.items():
                    res[name].append(timeit(f, n))
            m = {n_: statistics.median(x) for n_, x in res.items()}
            print(f"q={q_len:3d} ctx={ctx:4d}: flash {m['sdpa_packed']:.3f} ms, kernel {m['packed_kernel']:.3f} ms, "
                  f"ratio {m['sdpa_packed'] / m['packed_kernel']:.2f}x, max|diff| {(a - b_).abs().max():.2e}", flush=True)
