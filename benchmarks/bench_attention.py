"""Decode attention of a grouped-query model on CPU: transformers' two sdpa paths side by side (docs/performance.md,
"Rollout").

For one query token per row, transformers' ``sdpa`` attention either drops the mask (no row padded) and calls torch's
SDPA with ``enable_gqa=True`` on [B, H, 1, D], or keeps it (some row padded) and packs the G query heads of each KV
head as rows, [B, H_kv, G, D]; ``rollout.attention=sdpa_packed`` (``interq.rollout.attention``) always packs. This
times both calls (process CPU time, the fastest of ``--repeats`` interleaved runs of ``--calls`` calls) at SmolLM2's
shapes by default, in bf16 and fp32, for several cached lengths, and says whether they give the same bits. In bf16,
where interq's CPU kernels run on AMX-BF16, it also times ``sdpa_packed``'s one-call decode (``flash_decode_amx``,
torch's packed computation in one call) against the packed call and checks its bits.

    .venv/bin/python benchmarks/bench_attention.py [--threads 1] [--batch 16] [--heads 9] [--kv-heads 3] [--head-dim 64]

The last line is ``RESULT {json}`` (``packed_speedup`` per dtype and length, ``same_bits`` likewise,
``flash_speedup`` / ``flash_same_bits`` per length (bf16; absent where the kernel cannot run), ``machine``).
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F

from interq._optional import available
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
    flash = None
    from interq.rollout.attention import flash_decode_matches

    if available("interq.quant"):
        from interq import kernels

        kernels.load()
        if flash_decode_matches(h // hkv, d):
            flash = kernels.get().flash_decode_amx
    print(f"one-call flash decode (bf16): {'on' if flash else 'not available here'}")
    print("| dtype | cached tokens | enable_gqa [B, H, 1, D] us | packed [B, H_kv, G, D] us | packed speed-up | same bits "
          "| one-call us | one-call / packed | same bits |")
    print("|---|---|---|---|---|---|---|---|---|")
    speedup, same, f_speedup, f_same = {}, {}, {}, {}
    for dtype in (torch.bfloat16, torch.float32):
        name = str(dtype).replace("torch.", "")
        for k_len in (int(x) for x in args.lengths.split(",")):
            torch.manual_seed(k_len)
            q = torch.randn(b, h, 1, d, dtype=dtype)
            k, v = torch.randn(b, hkv, k_len, d, dtype=dtype), torch.randn(b, hkv, k_len, d, dtype=dtype)
            gqa = lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)  # noqa: E731
            packed = lambda: F.scaled_dot_product_attention(q.reshape(b, hkv, h // hkv, d), k, v)  # noqa: E731
            one = None
            if flash is not None and dtype == torch.bfloat16:
                one = lambda: flash(q.reshape(b, hkv, h // hkv, d), k, v, None, d ** -0.5)[0]  # noqa: E731
            gqa(), packed()  # warm-up
            tg, tp, tf = [], [], []
            for _ in range(args.repeats):  # interleaved
                tg.append(cpu_us(gqa, args.calls))
                tp.append(cpu_us(packed, args.calls))
                if one is not None:
                    tf.append(cpu_us(one, args.calls))
            g_us, p_us = min(tg), min(tp)
            eq = torch.equal(gqa(), packed().reshape(b, h, 1, d))
            speedup.setdefault(name, {})[k_len] = round(g_us / p_us, 2)
            same.setdefault(name, {})[k_len] = eq
            extra = "| - | - | - |"
            if one is not None:
                f_us, f_eq = min(tf), torch.equal(one().view(torch.int16), packed().view(torch.int16))
                f_speedup[k_len], f_same[k_len] = round(p_us / f_us, 2), f_eq
                extra = f"| {f_us:.0f} | {p_us / f_us:.2f}x | {f_eq} |"
            print(f"| {name} | {k_len} | {g_us:.0f} | {p_us:.0f} | {g_us / p_us:.2f}x | {eq} {extra}", flush=True)
    machine["load_avg_end"] = load_avg()
    print("RESULT " + json.dumps({"shape": {"batch": b, "heads": h, "kv_heads": hkv, "head_dim": d},
                                  "threads": args.threads, "packed_speedup": speedup, "same_bits": same,
                                  **({"flash_speedup": f_speedup, "flash_same_bits": f_same} if f_speedup else {}),
                                  "machine": machine}))


if __name__ == "__main__":
    main()
