"""Decode attention of a grouped-query model on CPU: transformers' two sdpa paths side by side (docs/benchmarks.md,
"Decode attention").

For one query token per row, transformers' ``sdpa`` attention either drops the mask (no row padded) and calls torch's
SDPA with ``enable_gqa=True`` on [B, H, 1, D], or keeps it (some row padded) and packs the G query heads of each KV
head as rows, [B, H_kv, G, D]; ``rollout.attention=sdpa_packed`` (``interq.rollout.attention``) always packs. This
times both calls (process CPU time, the fastest of ``--repeats`` interleaved runs of ``--calls`` calls) at SmolLM2's
shapes by default, in bf16 and fp32, for several cached lengths, and says whether they give the same bits.

    .venv/bin/python benchmarks/bench_attention.py [--threads 1] [--batch 16] [--heads 9] [--kv-heads 3] [--head-dim 64]

The last line is ``RESULT {json}`` (``packed_speedup`` per dtype and length, ``same_bits`` likewise, ``machine``).
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F

from interq.machine import describe, load_avg, machine_info


def cpu_us(fn, calls: int) -> float:
    """Process CPU microseconds per call, over ``calls`` calls."""
    t0 = time.process_time()
    for _ in range(calls):
        fn()
    return (time.process_time() - t0) / calls * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--heads", type=int, default=9)
    p.add_argument("--kv-heads", type=int, default=3)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--lengths", default="40,400,2000", help="cached tokens, comma-separated")
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    if args.heads % args.kv_heads:
        p.error(f"--kv-heads {args.kv_heads} must divide --heads {args.heads}")
    torch.set_num_threads(args.threads)
    machine = machine_info()
    print(f"bench_attention {time.strftime('%Y-%m-%d %H:%M')} on {describe(machine)}", flush=True)
    b, h, hkv, d = args.batch, args.heads, args.kv_heads, args.head_dim
    print("| dtype | cached tokens | enable_gqa [B, H, 1, D] us | packed [B, H_kv, G, D] us | packed speed-up | same bits |")
    print("|---|---|---|---|---|---|")
    speedup, same = {}, {}
    for dtype in (torch.bfloat16, torch.float32):
        name = str(dtype).replace("torch.", "")
        for k_len in (int(x) for x in args.lengths.split(",")):
            torch.manual_seed(k_len)
            q = torch.randn(b, h, 1, d, dtype=dtype)
            k, v = torch.randn(b, hkv, k_len, d, dtype=dtype), torch.randn(b, hkv, k_len, d, dtype=dtype)
            gqa = lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)  # noqa: E731
            packed = lambda: F.scaled_dot_product_attention(q.reshape(b, hkv, h // hkv, d), k, v)  # noqa: E731
            gqa(), packed()  # warm-up
            tg, tp = [], []
            for _ in range(args.repeats):  # interleaved
                tg.append(cpu_us(gqa, args.calls))
                tp.append(cpu_us(packed, args.calls))
            g_us, p_us = min(tg), min(tp)
            eq = torch.equal(gqa(), packed().reshape(b, h, 1, d))
            speedup.setdefault(name, {})[k_len] = round(g_us / p_us, 2)
            same.setdefault(name, {})[k_len] = eq
            print(f"| {name} | {k_len} | {g_us:.0f} | {p_us:.0f} | {g_us / p_us:.2f}x | {eq} |", flush=True)
    machine["load_avg_end"] = load_avg()
    print("RESULT " + json.dumps({"shape": {"batch": b, "heads": h, "kv_heads": hkv, "head_dim": d},
                                  "threads": args.threads, "packed_speedup": speedup, "same_bits": same,
                                  "machine": machine}))


if __name__ == "__main__":
    main()
