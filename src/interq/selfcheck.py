"""``interq selfcheck``: exercise the correction math on a synthetic batch and print its metrics.

Builds a batch of multi-turn trajectories (default 64 x 8 turns) whose per-token mismatch has a mean
that drifts along the turns, so the raw prefix log-ratio sum_{k<t} D[k] grows with t, plus a few
poorly supported spikes.  Runs every correction of docs/algorithm.md, prints one table row per
method and the per-turn accumulation curve, checks the §3 properties on the batch, and ends with one
line ``RESULT {json}``.  Exit status 0 when every check passes.  Runs in seconds on a CPU.
"""

from __future__ import annotations

import argparse
import json
import math
import time

import torch

from interq.algo.corrections import METHODS, CorrectionConfig, compute_correction, interq_prefix_logweights
from interq.algo.metrics import turn_curve


def synthetic_batch(n_traj: int, n_turns: int, seed: int):
    """Concatenated batch [n_traj, L] and the same episodes as shuffled per-turn rows.

    Returns (concat, per_turn, spans): concat = (proximal, behavior, mask); per_turn = (proximal,
    behavior, mask, traj_id, turn_idx, perm); spans[i][t] = (start, end) columns of turn t of row i.
    """
    g = torch.Generator().manual_seed(seed)
    obs_len = torch.randint(3, 9, (n_traj, n_turns), generator=g)  # [N, T]
    act_len = torch.randint(1, 13, (n_traj, n_turns), generator=g)  # [N, T], includes one-token actions
    span = obs_len + act_len  # [N, T]
    L = int(span.sum(1).max()) + 4
    mask = torch.zeros(n_traj, L, dtype=torch.bool)
    turn_of_col = torch.zeros(n_traj, L, dtype=torch.long)
    spans = []
    for i in range(n_traj):  # building the synthetic data, not the hot path
        c, row = 0, []
        for t in range(n_turns):
            s, e = c + int(obs_len[i, t]), c + int(span[i, t])
            mask[i, s:e] = True
            turn_of_col[i, c:e] = t
            row.append((c, e))
            c = e
        spans.append(row)
    proximal = -torch.rand(n_traj, L, generator=g) * 2.0  # [N, L]
    bias = 0.01 + 0.02 * torch.rand(n_traj, 1, generator=g)  # [N, 1] per-trajectory systematic shift
    drift = bias * (1.0 + 0.25 * turn_of_col.float())  # [N, L] mean mismatch grows along the turns
    noise = torch.randn(n_traj, L, generator=g) * 0.05  # [N, L]
    spikes = (torch.rand(n_traj, L, generator=g) < 0.02).float() * torch.randn(n_traj, L, generator=g) * 1.5  # [N, L]
    behavior = proximal - (drift + noise + spikes)  # [N, L], delta = proximal - behavior
    # per-turn rows: one row per (trajectory, turn), observation then action, shuffled
    Lt = int(span.max())
    R = n_traj * n_turns
    pp = torch.zeros(R, Lt)
    bb = torch.zeros(R, Lt)
    mm = torch.zeros(R, Lt, dtype=torch.bool)
    tid = torch.arange(n_traj).repeat_interleave(n_turns)  # [R]
    tix = torch.arange(n_turns).repeat(n_traj)  # [R]
    for r in range(R):
        i, t = int(tid[r]), int(tix[r])
        c, e = spans[i][t]
        pp[r, : e - c], bb[r, : e - c], mm[r, : e - c] = proximal[i, c:e], behavior[i, c:e], mask[i, c:e]
    perm = torch.randperm(R, generator=g)
    per_turn = (pp[perm], bb[perm], mm[perm], tid[perm] * 7 + 1000, tix[perm] * 2, perm)
    return (proximal, behavior, mask), per_turn, spans


def _per_turn_to_concat(w_rows: torch.Tensor, perm: torch.Tensor, spans, shape) -> torch.Tensor:
    n_turns = len(spans[0])
    out = torch.zeros(shape)
    for k, r in enumerate(perm.tolist()):
        i, t = divmod(r, n_turns)
        c, e = spans[i][t]
        out[i, c:e] = w_rows[k, : e - c]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="interq selfcheck", description=__doc__.splitlines()[0])
    ap.add_argument("--trajectories", type=int, default=64)
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--budget", type=float, default=CorrectionConfig().budget, help="InterQ budget B (nats)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.trajectories < 1 or args.turns < 2:
        ap.error("need --trajectories >= 1 and --turns >= 2")
    t0 = time.perf_counter()
    cfg = CorrectionConfig(budget=args.budget)
    (p, b, mask), (pp, bb, mm, tid, tix, perm), spans = synthetic_batch(args.trajectories, args.turns, args.seed)

    results = {m: compute_correction(m, p, b, mask, config=cfg) for m in METHODS}
    print(f"interq selfcheck: {args.trajectories} trajectories x {args.turns} turns, {int(mask.sum())} action tokens, budget B = {args.budget}")
    print()
    print(f"{'method':<15} {'w mean':>8} {'w std':>8} {'w min':>8} {'w max':>8} {'ess':>6} {'keep':>6}")
    for m, c in results.items():
        x = c.metrics
        print(f"{m:<15} {x['weights/mean']:>8.4f} {x['weights/std']:>8.4f} {x['weights/min']:>8.4f} {x['weights/max']:>8.4f} {x['weights/ess']:>6.3f} {x['weights/keep_frac']:>6.3f}")
    iq = results["interq"].metrics
    raw_curve = turn_curve(iq, "abs_prefix_logratio")
    lam_curve = turn_curve(iq, "abs_Lambda")
    d_curve = turn_curve(iq, "abs_delta_mean")
    print()
    print(f"{'turn':>4} {'|delta| mean':>13} {'|prefix log-ratio|':>19} {'|Lambda|':>9}")
    for t, (dv, rv, lv) in enumerate(zip(d_curve, raw_curve, lam_curve), start=1):
        print(f"{t:>4} {dv:>13.4f} {rv:>19.4f} {lv:>9.4f}")
    print()
    print(
        "mismatch: k1 %.4f  k3 %.5f  chi2 %.4f  |delta| %.4f   interq: bound frac %.3f  support %.3f  kappa %.3f"
        % (iq["mismatch/k1"], iq["mismatch/k3"], iq["mismatch/chi2_token"], iq["mismatch/abs_delta_mean"], iq["interq/budget_bound_frac"], iq["interq/support_mean"], iq["interq/kappa_mean"])
    )

    # §3 properties on this batch
    checks: dict[str, bool] = {}
    lam = results["interq"].lambda_
    first_turn = torch.zeros_like(mask)
    for i, row in enumerate(spans):
        first_turn[i, row[0][0] : row[0][1]] = True
    checks["p1_lambda_within_budget"] = bool(lam.abs().max() <= args.budget + 1e-6)
    checks["p1_first_turn_lambda_zero"] = bool((lam[first_turn & mask] == 0).all())
    z = compute_correction("interq", p, b, mask, config=CorrectionConfig(budget=0.0))
    checks["p2_zero_budget_is_tis"] = bool(torch.equal(z.weights, results["tis"].weights))
    full = interq_prefix_logweights(p, b, mask, math.inf, uniform_support=True)
    raw = compute_correction("prefix_is", p, b, mask, config=CorrectionConfig(prefix_cap=math.inf)).lambda_
    checks["p3_inf_budget_uniform_is_full_prefix"] = bool(torch.allclose(full, raw, atol=1e-5))
    # p4: multiplying the token ratios of one earlier turn by c leaves its support (hence, with B = inf,
    # its contribution s*D moves by exactly s * n * log c)
    c_ = 3.0
    i0, (s0, e0) = 0, spans[0][0]
    seg = torch.zeros_like(mask)
    seg[i0, s0:e0] = mask[i0, s0:e0]
    n0 = int(seg.sum())
    lam_a = interq_prefix_logweights(p, b, mask, math.inf)
    lam_b = interq_prefix_logweights(p, torch.where(seg, b - math.log(c_), b), mask, math.inf)
    s1, e1 = spans[0][1]
    shift = (lam_b[i0, s1:e1] - lam_a[i0, s1:e1])[mask[i0, s1:e1]]
    # the shift equals s0 * n0 * log c with the unchanged s0 = Lambda_a(turn 2) / D0
    d0 = float((p - b)[seg].double().sum())
    s0_est = float(lam_a[i0, s1:e1][mask[i0, s1:e1]][0]) / d0
    checks["p4_support_invariant_to_ratio_scaling"] = bool(torch.allclose(shift, torch.full_like(shift, s0_est * n0 * math.log(c_)), atol=1e-4))
    cpt = {m: compute_correction(m, pp, bb, mm, traj_id=tid, turn_idx=tix, config=cfg) for m in METHODS}
    checks["p6_layouts_identical"] = all(
        torch.allclose(_per_turn_to_concat(cpt[m].weights, perm, spans, mask.shape), results[m].weights, atol=1e-6, rtol=1e-6) for m in METHODS
    )
    rows = torch.randperm(p.shape[0], generator=torch.Generator().manual_seed(1))
    checks["p6_row_order_invariant"] = bool(torch.equal(compute_correction("interq", p[rows], b[rows], mask[rows], config=cfg).weights, results["interq"].weights[rows]))
    pg = p.clone().requires_grad_(True)
    checks["p7_no_grad"] = not compute_correction("interq", pg, b, mask, config=cfg).weights.requires_grad
    checks["curve_raw_prefix_grows"] = raw_curve[-1] > raw_curve[1] > 0
    checks["curve_lambda_inside_budget"] = max(lam_curve) <= args.budget + 1e-9
    checks["all_metrics_finite"] = all(math.isfinite(v) for c in results.values() for v in c.metrics.values())

    print()
    for k, ok in checks.items():
        print(f"  [{'ok' if ok else 'FAIL'}] {k}")
    passed = all(checks.values())
    result = {
        "ok": passed,
        "checks_passed": sum(checks.values()),
        "checks_total": len(checks),
        "failed": [k for k, ok in checks.items() if not ok],
        "budget": args.budget,
        "raw_prefix_logratio_last_turn": round(raw_curve[-1], 4),
        "abs_Lambda_last_turn": round(lam_curve[-1], 4),
        "interq_ess": round(iq["weights/ess"], 4),
        "prefix_is_ess": round(results["prefix_is"].metrics["weights/ess"], 4),
        "seconds": round(time.perf_counter() - t0, 2),
    }
    print("RESULT " + json.dumps(result))
    return 0 if passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
