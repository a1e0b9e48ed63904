"""The executor's GEMMs alone: ``torch._int_mm`` (int8 x int8 -> int32), the ``fp32_exact`` backend (an fp32 GEMM of
the integer codes) and the bf16 ``nn.functional.linear`` they replace, at SmolLM2-135M-Instruct's decode shapes
(hidden 576, q|k|v 960, o 576, gate|up 3072, down 1536 -> 576; the lm-head stays bf16 in both executors).

Shows how much of a decode step int8 can save at all: per layer, the four GEMMs' time in each backend, summed over
the 30 layers. Timed by this process's CPU time (``time.process_time``, the load-robust figure), medians of
``--rounds`` interleaved rounds of ``--calls`` calls. Ends with ``RESULT {json}`` (``machine``: where it ran).

    .venv/bin/python benchmarks/bench_gemm.py [--threads 1] [--batch 16] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from interq.machine import describe, load_avg, machine_info

# (name, K, N) of one SmolLM2-135M decoder layer's quantized GEMMs, fused as the executor runs them
SHAPES = (("qkv", 576, 960), ("o", 576, 576), ("gate_up", 576, 3072), ("down", 1536, 576))
LAYERS = 30


def _cpu_us(fn, calls: int) -> float:
    fn()
    c0 = time.process_time()
    for _ in range(calls):
        fn()
    return (time.process_time() - c0) / calls * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=16, help="rows (M): decode batch size")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=40)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    machine = machine_info()
    print(f"bench_gemm on {describe(machine)}", flush=True)
    g = torch.Generator().manual_seed(0)
    res: dict = {}
    print(f"| GEMM (M={args.batch}) | K x N | int_mm us | fp32_exact us | bf16 linear us | int_mm weight GB/s | "
          "bf16 over int_mm |\n|---|---|---|---|---|---|---|")
    for name, k, n in SHAPES:
        a = torch.randint(-128, 128, (args.batch, k), generator=g, dtype=torch.int8)
        b = torch.randint(-127, 128, (k, n), generator=g, dtype=torch.int8)
        af, bf = a.float(), b.float()
        x = torch.randn(args.batch, k, generator=g).to(torch.bfloat16)
        w = torch.randn(n, k, generator=g).to(torch.bfloat16)
        assert torch.equal(torch._int_mm(a, b), (af @ bf).to(torch.int32))  # the same accumulator (K <= 1024 here)
        arms = {"int_mm": lambda: torch._int_mm(a, b), "fp32_exact": lambda: af @ bf,
                "bf16_linear": lambda: torch.nn.functional.linear(x, w)}
        times = {k_: [] for k_ in arms}
        for _ in range(args.rounds):
            for arm, fn in arms.items():
                times[arm].append(_cpu_us(fn, args.calls))
        med = {arm: statistics.median(v) for arm, v in times.items()}
        res[name] = {"k": k, "n": n, **{f"{arm}_us": round(v, 1) for arm, v in med.items()},
                     "int_mm_weight_gb_per_s": round(k * n / med["int_mm"] / 1e3, 2)}
        print(f"| {name} | {k} x {n} | {med['int_mm']:.1f} | {med['fp32_exact']:.1f} | {med['bf16_linear']:.1f} | "
              f"{res[name]['int_mm_weight_gb_per_s']:.2f} | {med['bf16_linear'] / med['int_mm']:.2f} |", flush=True)
    per_step = {arm: round(LAYERS * sum(res[s][f"{arm}_us"] for s, _, _ in SHAPES) / 1e3, 2)
                for arm in ("int_mm", "fp32_exact", "bf16_linear")}
    print(f"decoder GEMMs per decode step ({LAYERS} layers), CPU ms: {per_step}")
    machine["load_avg_end"] = load_avg()
    result = {"batch": args.batch, "threads": args.threads, "machine": machine, "shapes": res,
              "decoder_gemm_ms_per_step": per_step,
              "gemm_saving_ms_per_step": round(per_step["bf16_linear"] - per_step["int_mm"], 2),
              "bf16_over_int_mm_gemm": round(per_step["bf16_linear"] / per_step["int_mm"], 3)}
    print("RESULT " + json.dumps(result, sort_keys=True))


if __name__ == "__main__":
    main()
