"""Peak memory of one learner micro-batch on SmolLM2-135M-Instruct, activations kept against recomputed
(``train.gradient_checkpointing``), with the CPU time of each.

What runs is what ``interq.train.rl.update`` runs per micro-batch: inside ``learner_context`` (the aligned forward
of q-align / q-interq by default, ``--plain`` for the others) the action-token log-probs, the PPO loss and the
backward, on ``--rows`` concatenated rows of ``--turns`` x (``--obs-tokens`` + ``--act-tokens``) random tokens (the
trainer's default micro-batch is 4096 tokens). Each mode runs in a fresh subprocess so its peak resident memory
(``ru_maxrss``) is its own; "model" is the resident memory after loading SmolLM2 in fp32, before the pass. The
RESULT line holds both modes, ``memory_ratio`` (kept over recomputed, pass memory above the model) and
``cpu_ratio`` (recomputed over kept) and the machine record.

    .venv/bin/python benchmarks/bench_learner_memory.py [--threads 1] [--rows 2] [--turns 16] [--plain]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time


def child(args) -> dict:
    import torch

    from interq.models.pretrained import load_smollm2
    from interq.quant import QuantConfig
    from interq.train.rl import enable_activation_checkpointing

    from bench_learner import learner_pass, make_rows  # the throughput benchmark's rows and pass (this directory)

    torch.set_num_threads(args.threads)
    model = load_smollm2(torch.float32)[0]
    enable_activation_checkpointing(model, args.child == "recomputed")
    model.train()
    ids, mask, act = make_rows(model.config.vocab_size, args.rows, args.turns, args.obs_tokens, args.act_tokens)  # [R, L]
    model_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    c0 = time.process_time()
    learner_pass(model, ids, mask, act, not args.plain, QuantConfig())  # log-probs, PPO loss, backward
    cpu = time.process_time() - c0
    grad_norm = float(torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None]).norm())
    return {"mode": args.child, "model_gb": model_kb / 2**20, "peak_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
            "cpu_s": cpu, "tokens": int(ids.numel()), "grad_norm": grad_norm}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rows", type=int, default=2)
    ap.add_argument("--turns", type=int, default=16)
    ap.add_argument("--obs-tokens", type=int, default=120)
    ap.add_argument("--act-tokens", type=int, default=8)
    ap.add_argument("--plain", action="store_true", help="the plain learner (bf16, q-naive, q-tis) instead of the aligned one")
    ap.add_argument("--child", choices=["kept", "recomputed"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return 0
    from interq.machine import describe, load_avg, machine_info

    machine = machine_info()
    print(f"machine: {describe(machine)}", file=sys.stderr, flush=True)
    out = {}
    for mode in ("kept", "recomputed"):
        cmd = [sys.executable, __file__, "--child", mode, "--threads", str(args.threads), "--rows", str(args.rows),
               "--turns", str(args.turns), "--obs-tokens", str(args.obs_tokens), "--act-tokens", str(args.act_tokens)]
        res = subprocess.run(cmd + (["--plain"] if args.plain else []), capture_output=True, text=True)
        if res.returncode != 0:
            print(res.stderr[-2000:], file=sys.stderr)
            raise SystemExit(f"{mode}: exit {res.returncode}")
        out[mode] = json.loads(res.stdout.strip().splitlines()[-1])
        print(f"[{mode}] {out[mode]}", file=sys.stderr, flush=True)
    k, r = out["kept"], out["recomputed"]
    learner = "plain" if args.plain else "aligned"
    print(f"\n| SmolLM2-135M, {learner} learner, {k['tokens']} tokens | model (GB) | peak (GB) | pass above model (GB) | CPU s |")
    print("|---|---|---|---|---|")
    for name, x in (("activations kept", k), ("recomputed (train.gradient_checkpointing)", r)):
        print(f"| {name} | {x['model_gb']:.2f} | {x['peak_gb']:.2f} | {x['peak_gb'] - x['model_gb']:.2f} | {x['cpu_s']:.1f} |")
    result = {"learner": learner, "tokens": k["tokens"], "kept": k, "recomputed": r,
              "memory_ratio": round((k["peak_gb"] - k["model_gb"]) / max(r["peak_gb"] - r["model_gb"], 1e-9), 3),
              "cpu_ratio": round(r["cpu_s"] / k["cpu_s"], 3),
              "grad_norm_rel_diff": abs(k["grad_norm"] - r["grad_norm"]) / k["grad_norm"],
              "machine": {**machine, "load_avg_end": load_avg()}}
    print("RESULT " + json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
