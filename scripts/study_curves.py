"""Held-out success of every run of a study directory, per evaluation step, as a markdown table (one row per run).

    .venv/bin/python scripts/study_curves.py results/study-text [--regime matched]

Reads ``<dir>/<run>/metrics.jsonl`` (the records ``interq compare`` writes; checkpoints not needed) and prints, per
run, the held-out success at each evaluated step, its best, its last step, the mean |log mu - log pi| over its
training rows and (InterQ) the share of rows where the budget binds; then, per run, the mean |log mu - log pi| of
its training rollouts in each quarter of the run (how the executor-learner mismatch moves as the policy trains).
Unfinished runs are marked.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

RUN = re.compile(r"^(?P<arm>[A-Za-z0-9_.\-]+?)(?:@(?P<regime>[a-z]+))?-s(?P<seed>\d+)$")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("study_dir", type=Path)
    ap.add_argument("--regime", default="matched", help="runs of this executor regime (natural or matched), plus bf16 "
                    "(default: matched)")
    ap.add_argument("--target", type=int, default=200, help="the runs' last step (default: 200)")
    args = ap.parse_args()
    rows = []
    for d in sorted(p for p in args.study_dir.iterdir() if (p / "metrics.jsonl").is_file()):
        m = RUN.match(d.name)
        # a run of the natural regime has no @regime in its name (interq compare's naming); bf16 belongs to both
        if not m or (m["arm"] != "bf16" and (m["regime"] or "natural") != args.regime):
            continue
        recs = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines() if line.strip()]
        evals = {r["step"]: r["eval/success"] for r in recs if "eval/success" in r}
        deltas = [r["mismatch/abs_delta_mean"] for r in recs if "mismatch/abs_delta_mean" in r]
        bound = [r["interq/budget_bound_frac"] for r in recs if "interq/budget_bound_frac" in r]
        by_step = [(r["step"], r["mismatch/abs_delta_mean"]) for r in recs if "mismatch/abs_delta_mean" in r]
        rows.append((m["arm"], int(m["seed"]), evals, max(r.get("step", 0) for r in recs),
                     sum(deltas) / len(deltas) if deltas else None, sum(bound) / len(bound) if bound else None,
                     by_step))
    steps = sorted({s for r in rows for s in r[2]})
    print("| run | " + " | ".join(f"step {s}" for s in steps) + " | best | mean abs delta | budget binds |")
    print("|---|" + "---|" * (len(steps) + 3))
    order = {"bf16": 0, "q-naive": 1, "q-tis": 2, "q-align": 3, "q-interq": 4}
    rows.sort(key=lambda r: (order.get(r[0], 9), r[0], r[1]))
    for arm, seed, evals, last, delta, bound, _ in rows:
        cells = [f"{evals[s]:.3f}" if s in evals else "" for s in steps]
        name = f"{arm} s{seed}" + ("" if last >= args.target else f" (at step {last}, running)")
        best = f"{max(evals.values()):.3f}" if evals else ""
        print(f"| {name} | " + " | ".join(cells) + f" | {best} | {'' if delta is None else f'{delta:.4f}'} | "
              f"{'' if bound is None else f'{bound:.2f}'} |")
    q = args.target // 4
    phases = [(1 + i * q, (i + 1) * q) for i in range(4)]
    print("\n| run: mean abs delta of the training rollouts, steps | " + " | ".join(f"{a}-{b}" for a, b in phases) + " |")
    print("|---|" + "---|" * len(phases))
    for arm, seed, _, last, _, _, by_step in rows:
        cells = []
        for a, b in phases:
            v = [x for st, x in by_step if a <= st <= b]
            cells.append(f"{sum(v) / len(v):.3f}" if v else "")
        print(f"| {arm} s{seed}{'' if last >= args.target else ' (running)'} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
