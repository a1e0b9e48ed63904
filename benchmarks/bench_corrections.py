"""Benchmark of the corrections (docs/algorithm.md): tis, prefix_is, interq side by side.

Batch: 256 trajectories x 4,096 tokens x 30 turns (concatenated layout, about 60% of each turn's tokens
are action tokens), then the same at 2x tokens (8,192 per row, same 30 turns), then the 1x batch in the
per-turn layout (one row per (trajectory, turn), shuffled).  Each timing is the fastest of several
interleaved runs, measured as process CPU time with one torch thread, of the full
``compute_correction`` (weights, keep-mask and every §7 metric); "core" times the weights alone (no
metrics).  Ratios measured side by side in one run are the result; absolute times depend on
the machine, which the header and the RESULT line record (``machine``: ``interq.machine.machine_info()`` at the
start plus ``load_avg_end``).  The last line is ``RESULT {json}``.

    .venv/bin/python benchmarks/bench_corrections.py [--threads N] [--repeats N] [--quick]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import time

import torch

from interq.algo.corrections import _REGISTRY, CorrectionConfig, CorrectionMethod, _prepare, compute_correction
from interq.machine import describe, load_avg, machine_info

METHODS = ("tis", "prefix_is", "interq")


def make_batch(n_traj: int, n_tok: int, n_turns: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    per = n_tok // n_turns
    col = torch.arange(n_tok)
    pos_in_turn = col % per
    turn_of_col = (col // per).clamp(max=n_turns - 1)
    mask_row = pos_in_turn >= int(0.4 * per)  # observation first (40%), then the action (60%)
    mask = mask_row[None, :].expand(n_traj, n_tok).clone()  # [B, L]
    prox = -torch.rand(n_traj, n_tok, generator=g) * 2  # [B, L]
    drift = 0.002 * turn_of_col.float()[None, :]  # [1, L], mismatch mean drifts along turns
    beh = prox - (torch.randn(n_traj, n_tok, generator=g) * 0.05 + drift)  # [B, L]
    return prox, beh, mask, turn_of_col


def to_per_turn(prox, beh, mask, turn_of_col, n_turns, seed=0):
    B, L = prox.shape
    per = L // n_turns
    rows_p = prox[:, : per * n_turns].reshape(B * n_turns, per)  # [B*T, per]
    rows_b = beh[:, : per * n_turns].reshape(B * n_turns, per)
    rows_m = mask[:, : per * n_turns].reshape(B * n_turns, per)
    tid = torch.arange(B).repeat_interleave(n_turns)
    tix = torch.arange(n_turns).repeat(B)
    perm = torch.randperm(B * n_turns, generator=torch.Generator().manual_seed(seed))
    return rows_p[perm], rows_b[perm], rows_m[perm], tid[perm], tix[perm]


def _cpu() -> tuple[float, float]:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime, r.ru_stime


def time_interleaved(fns: dict, repeats: int) -> tuple[dict, dict]:
    """Run every function once per round, ``repeats`` rounds, in turn (so all see the same load).

    The time of each is the CPU time of this process in its fastest round (user + system: with one
    torch thread it is barely affected by other work on a shared machine); returns (total, user only).
    System time is the kernel zero-filling fresh pages for large temporaries (glibc hands allocations
    above its mmap threshold back to the kernel on free), which is why both are reported.
    """
    for fn in fns.values():
        fn()  # warm-up
    ts: dict = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            u0, s0 = _cpu()
            fn()
            u1, s1 = _cpu()
            ts[k].append((u1 - u0 + s1 - s0, u1 - u0))
    best = {k: min(v) for k, v in ts.items()}
    return {k: v[0] for k, v in best.items()}, {k: v[1] for k, v in best.items()}


def core(method, p, b, m, tid=None, tix=None, cfg=CorrectionConfig()):
    with torch.no_grad():
        bt = _prepare(p, b, m, tid, tix)
        return _REGISTRY[CorrectionMethod(method)](bt, cfg)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1: the machine is shared)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="a small batch (for a smoke run)")
    ap.add_argument("--trajectories", type=int, default=256)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--turns", type=int, default=30)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    machine = machine_info()  # at the start (load_avg_end added at the end)
    print(f"machine: {describe(machine)}", flush=True)
    B, L, T = (16, 512, 8) if args.quick else (args.trajectories, args.tokens, args.turns)

    batches = {}
    for scale in (1, 2):
        p, b, m, toc = make_batch(B, L * scale, T)
        batches[f"{scale}x"] = (p, b, m, None, None)
    p, b, m, toc = make_batch(B, L, T)
    pp, bb, mm, tid, tix = to_per_turn(p, b, m, toc, T)
    batches["per_turn"] = (pp, bb, mm, tid, tix)
    fns = {}
    for name, (p_, b_, m_, t_, i_) in batches.items():
        for meth in METHODS:
            fns[f"{meth}_{name}_s"] = lambda meth=meth, p_=p_, b_=b_, m_=m_, t_=t_, i_=i_: compute_correction(meth, p_, b_, m_, traj_id=t_, turn_idx=i_)
            fns[f"{meth}_{name}_core_s"] = lambda meth=meth, p_=p_, b_=b_, m_=m_, t_=t_, i_=i_: core(meth, p_, b_, m_, t_, i_)
    res, res_user = time_interleaved(fns, args.repeats)
    rows = []
    for name, (p_, *_rest) in batches.items():
        for meth in METHODS:
            label = {"1x": "concat 1x", "2x": "concat 2x", "per_turn": "per-turn 1x"}[name]
            rows.append((label, meth, p_.shape[0], p_.shape[1], res[f"{meth}_{name}_s"], res_user[f"{meth}_{name}_s"], res[f"{meth}_{name}_core_s"]))
    # sanity: the two layouts agree on the benchmark batch
    a = compute_correction("interq", p, b, m)
    c = compute_correction("interq", pp, bb, mm, traj_id=tid, turn_idx=tix)
    per = L // T
    inv = torch.empty_like(torch.arange(pp.shape[0]))
    inv[torch.randperm(pp.shape[0], generator=torch.Generator().manual_seed(0))] = torch.arange(pp.shape[0])
    w_pt = c.weights[inv].reshape(B, T * per)
    layout_err = float((w_pt - a.weights[:, : T * per]).abs().max())

    print(f"corrections benchmark: {B} trajectories x {L} tokens x {T} turns; torch {torch.__version__}, {args.threads} thread(s)")
    print(f"{'batch':<12} {'method':<10} {'rows':>6} {'tokens/row':>10} {'full cpu-ms':>11} {'(user)':>8} {'core cpu-ms':>11}")
    for name, meth, r, l, tf, tu, tc in rows:
        print(f"{name:<12} {meth:<10} {r:>6} {l:>10} {tf * 1e3:>11.1f} {tu * 1e3:>8.1f} {tc * 1e3:>11.1f}")
    out = {
        "interq_over_tis": res["interq_1x_s"] / res["tis_1x_s"],
        "interq_over_tis_core": res["interq_1x_core_s"] / res["tis_1x_core_s"],
        "prefix_is_over_tis": res["prefix_is_1x_s"] / res["tis_1x_s"],
        "scaling_2x": res["interq_2x_s"] / res["interq_1x_s"],
        "scaling_2x_core": res["interq_2x_core_s"] / res["interq_1x_core_s"],
        "scaling_2x_user": res_user["interq_2x_s"] / res_user["interq_1x_s"],
        "interq_over_tis_user": res_user["interq_1x_s"] / res_user["tis_1x_s"],
        "per_turn_over_concat_interq": res["interq_per_turn_s"] / res["interq_1x_s"],
        "interq_1x_ms": res["interq_1x_s"] * 1e3,
        "tis_1x_ms": res["tis_1x_s"] * 1e3,
        "layout_max_abs_diff": layout_err,
        "batch": [B, L, T],
        "threads": args.threads,
        "machine": {**machine, "load_avg_end": load_avg()},
    }
    print(
        "interq/tis = %.2f (core %.2f, user %.2f); interq 2x/1x = %.2f (user %.2f); layouts max |dw| = %.1e"
        % (out["interq_over_tis"], out["interq_over_tis_core"], out["interq_over_tis_user"], out["scaling_2x"], out["scaling_2x_user"], layout_err)
    )
    print("RESULT " + json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in out.items()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
