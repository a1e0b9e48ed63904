"""``interq demo`` and ``interq compare``: arms over seeds from one shared warm start; tables and plots.

Both write everything under ``--out`` (one run directory per arm and seed, each with ``config.yaml``,
``metrics.jsonl`` and checkpoints), a markdown table, PNG plots, a ``summary.json``, and end with one line
``RESULT {json}``. Re-running the same command resumes: the warm start and finished runs are reused, a killed
run continues from its last checkpoint, and a larger ``train.steps`` extends the runs. Reuse needs the same inputs:
the warm start its own config fields, each run its whole resolved config (``train.progress`` and
``train.tensorboard`` aside), both the same ``NUMERICS_VERSION`` (:mod:`interq.train.provenance`). Every directory
is checked before any work; if one differs the command stops with one line naming each directory and field
(``algo.budget: 0.5 -> 0.25``). ``--fresh`` moves those directories aside to ``<dir>.stale-<time>`` (deleting
nothing) and runs them again; the matching ones are still reused.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

from interq.train.config import ARMS, ConfigError, build_config

# Settings of the demo: small enough for <= 15 minutes on a shared 2-core CPU (measured in docs/results.md).
DEMO_OVERRIDES = [
    # on top of the household preset (which holds the measured learning settings: docs/results.md)
    "env.task_types=pick_and_place",
    # small rooms; 600 valid_unseen tasks of which 100 are pick_and_place: a held-out set of 100 task instances
    "env.env_kwargs={size: small, split_sizes: {valid_unseen: 600}}",
    "env.num_train_tasks=0",
    "env.num_eval_tasks=100",
    "rollout.max_action_tokens=4",
    "train.steps=20",
    "train.tasks_per_step=8",
    "train.eval_every_steps=10",
    "train.eval_episodes_per_task=1",
    "train.eval_temperature=0.5",
    "train.checkpoint_every_steps=10",
    "train.threads=1",  # a shared 2-core machine: 2 OpenMP threads stall each other under load
]


def _load(preset: str, overrides: list[str]):
    try:
        return build_config(preset, overrides)
    except ConfigError as e:
        print(f"interq: invalid configuration: {e}", file=sys.stderr)
        raise SystemExit(2) from None


def arm_config(arm: str, overrides: list[str]):
    """An arm's config: a preset name (the five arms of spec §4, or a YAML path), or ``q-<method>`` for any other
    correction method of spec §4, which is q-interq's setting (W8A8-KV8 executor, aligned learner) with that
    method: ``q-icepop``, ``q-prefix_is``, ``q-interq_uniform``, ..."""
    from interq.train.config import CORRECTIONS, preset_names

    if arm in preset_names() or arm.endswith((".yaml", ".yml")):
        return _load(arm, overrides)
    method = arm[2:] if arm.startswith("q-") else ""
    if method not in CORRECTIONS:
        print(f"interq: invalid configuration: arm {arm!r} is not accepted (unknown preset {arm!r}); choose a preset "
              f"{preset_names()} or q-<method> with method one of {list(CORRECTIONS)}", file=sys.stderr)
        raise SystemExit(2)
    return _load("q-interq", [f"algo.correction={method}", f"name={arm}", *overrides])


def run_arms(arms: list[str], seeds: list[int], overrides: list[str], out: Path, log=print, fresh: bool = False) -> dict:
    """Shared warm start, then one RL run per (arm, seed). Returns {arm: [records per seed]} and the warm start.

    Before any work, every arm's config is validated and the warm start and every run directory are checked
    (:mod:`interq.train.provenance`): one :class:`~interq.train.provenance.StaleResultError` names all that differ,
    or with ``fresh`` each of them is moved aside and started again."""
    from interq.train.pipeline import prepare_policy, run_training
    from interq.train.provenance import run_differences, settle, warm_start_differences, warm_start_identity

    base = _load("household", overrides)
    for arm in arms:  # validate every arm before any work
        arm_config(arm, overrides)
    cfgs = {(arm, seed): arm_config(arm, [*overrides, f"train.seed={seed}", f"name={arm}-s{seed}"])
            for arm in arms for seed in seeds}
    start_policy = warm_start_identity(base)
    settle([(out / "warm_start", warm_start_differences(base, out / "warm_start")),
            *((out / f"{arm}-s{seed}", run_differences(cfg, out / f"{arm}-s{seed}", start_policy))
              for (arm, seed), cfg in cfgs.items())], fresh, log)
    t0 = time.perf_counter()
    policy_dir, summary = prepare_policy(base, out / "warm_start", log=log)
    warm_s = time.perf_counter() - t0
    log(f"[warm start] {summary['policy']} ({warm_s:.0f}s)")
    runs: dict[str, list[list[dict]]] = {}
    for (arm, seed), cfg in cfgs.items():
        ts = time.perf_counter()
        recs = run_training(cfg, out / f"{arm}-s{seed}", policy_dir, log=log)
        runs.setdefault(arm, []).append(recs)
        ev = [r for r in recs if "eval/success" in r]
        log(f"[{arm} seed {seed}] held-out success {ev[0]['eval/success']:.3f} -> {ev[-1]['eval/success']:.3f} "
            f"({time.perf_counter() - ts:.0f}s)")
    return {"runs": runs, "warm_start_s": warm_s, "policy": summary}


def _evals(recs: list[dict]) -> list[tuple[int, float]]:
    return [(r["step"], r["eval/success"]) for r in recs if "eval/success" in r]


def _mean(xs):
    xs = [x for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]
    return sum(xs) / len(xs) if xs else float("nan")


def _std(xs):
    return statistics.pstdev(xs) if len(xs) > 1 else 0.0


def _run_seconds(recs: list[dict]) -> float:
    """The run's RL wall time from its own step timings (rollout, learner, sync, eval): also right for a reused run."""
    return sum(v for r in recs for k, v in r.items() if k.startswith("time/") and isinstance(v, (int, float)))


def _fwd_per_step(recs: list[dict]) -> float:
    return _mean([r["learner/forward_passes"] for r in recs if "learner/forward_passes" in r])


def summarize(runs: dict, threshold: float) -> dict:
    out = {}
    for arm, seed_runs in runs.items():
        finals = [_evals(r)[-1][1] for r in seed_runs]
        befores = [_evals(r)[0][1] for r in seed_runs]
        bests = [max(s for _, s in _evals(r)) for r in seed_runs]
        reach = [next((st for st, s in _evals(r) if s >= threshold), None) for r in seed_runs]
        out[arm] = {
            "success_before": _mean(befores),
            "success_final_mean": _mean(finals), "success_final_std": _std(finals),
            "success_best": _mean(bests),
            "steps_to_threshold": _mean(reach) if any(x is not None for x in reach) else None,
            "reached_threshold": sum(x is not None for x in reach), "seeds": len(seed_runs),
            "late_regression": _mean([b - f for b, f in zip(bests, finals)]),
            "wall_s": _mean([_run_seconds(r) for r in seed_runs]),
            "learner_forward_passes_per_step": _fwd_per_step([x for r in seed_runs for x in r]),
            "abs_delta_mean": _mean([x.get("mismatch/abs_delta_mean") for r in seed_runs for x in r]),
            "k3": _mean([x.get("mismatch/k3") for r in seed_runs for x in r]),
        }
    return out


def markdown_table(summary: dict, threshold: float) -> str:
    head = ("| arm | success before | final success (mean ± std) | best | steps to "
            f"{threshold:.2f} | late regression | learner fwd/step | mean abs delta | wall s |\n"
            "|---|---|---|---|---|---|---|---|---|\n")
    rows = []
    for arm, s in summary.items():
        reach = "never" if s["steps_to_threshold"] is None else f"{s['steps_to_threshold']:.1f} ({s['reached_threshold']}/{s['seeds']})"
        rows.append(f"| {arm} | {s['success_before']:.3f} | {s['success_final_mean']:.3f} ± {s['success_final_std']:.3f} | "
                    f"{s['success_best']:.3f} | {reach} | {s['late_regression']:.3f} | "
                    f"{s['learner_forward_passes_per_step']:.1f} | {s['abs_delta_mean']:.4f} | {s['wall_s']:.0f} |")
    return head + "\n".join(rows) + "\n"


def plot_curves(runs: dict, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for arm, seed_runs in runs.items():
        steps = sorted({st for r in seed_runs for st, _ in _evals(r)})
        ys = [_mean([dict(_evals(r)).get(st) for r in seed_runs]) for st in steps]
        axes[0].plot(steps, ys, marker="o", label=arm)
        rsteps = sorted({x["step"] for r in seed_runs for x in r if "rollout/success" in x})
        ry = [_mean([x["rollout/success"] for r in seed_runs for x in r if x.get("step") == st and "rollout/success" in x])
              for st in rsteps]
        axes[1].plot(rsteps, ry, label=arm, alpha=0.8)
    axes[0].set(xlabel="RL step", ylabel="held-out success", title=f"{title}: held-out success")
    axes[1].set(xlabel="RL step", ylabel="training rollout success", title="training rollouts")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def accumulation_curves(recs: list[dict]) -> dict[str, list[float]]:
    """Per-turn curves averaged over steps: turn/<curve>/<t> -> list indexed by t-1."""
    out: dict[str, dict[int, list[float]]] = {}
    for r in recs:
        for k, v in r.items():
            if k.startswith("turn/"):
                _, curve, t = k.split("/")
                out.setdefault(curve, {}).setdefault(int(t), []).append(v)
    return {c: [_mean(d[t]) for t in sorted(d)] for c, d in out.items()}


def plot_mismatch(runs: dict, path: Path, budget: float) -> dict:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    curves = {}
    for arm, seed_runs in runs.items():
        c = accumulation_curves([x for r in seed_runs for x in r])
        curves[arm] = c
        if "abs_prefix_logratio" in c and arm != "bf16" or arm == "bf16":
            ys = c.get("abs_prefix_logratio", [])
            ax.plot(range(1, len(ys) + 1), ys, marker=".", label=f"{arm}: |raw prefix log-ratio|")
        if c.get("abs_Lambda"):
            ax.plot(range(1, len(c["abs_Lambda"]) + 1), c["abs_Lambda"], marker="s", ls="--", label=f"{arm}: |Lambda| (InterQ)")
    ax.axhline(budget, color="grey", ls=":", label=f"budget B = {budget}")
    ax.set(xlabel="turn t", ylabel="nats", title="mismatch accumulation along the history")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return curves


def _common_args(p: argparse.ArgumentParser, out: str) -> None:
    p.add_argument("--out", default=out, help=f"output directory (default: {out})")
    p.add_argument("--threshold", type=float, default=0.5, help="held-out success threshold for 'steps to threshold'")
    p.add_argument("--fresh", action="store_true", help="move a warm start or run directory under --out that was made "
                   "from other inputs aside to <dir>.stale-<time> and run it again (default: stop and name them)")
    p.add_argument("overrides", nargs="*", help="key.sub=value overrides applied to every arm (after the built-in ones)")


def demo_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="interq demo", description="warm start, then short RL runs of bf16 and q-interq on "
                                "household; prints a table, writes a plot, ends with RESULT {json}")
    _common_args(p, "runs/demo")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    overrides = [*DEMO_OVERRIDES, *args.overrides]
    arms = ["bf16", "q-interq"]
    res = run_arms(arms, [args.seed], overrides, out, fresh=args.fresh)
    summary = summarize(res["runs"], args.threshold)
    table = markdown_table(summary, args.threshold)
    (out / "demo.md").write_text(table)
    plot_curves(res["runs"], out / "demo.png", "demo")
    budget = _load("q-interq", overrides).algo.budget
    plot_mismatch(res["runs"], out / "mismatch.png", budget)
    total = time.perf_counter() - t0
    print(table)
    print(f"plots: {out / 'demo.png'}, {out / 'mismatch.png'}; warm start {res['warm_start_s']:.0f}s; total {total:.0f}s")
    result = {"total_wall_s": round(total, 1), "warm_start_s": round(res["warm_start_s"], 1),
              "policy_parameters": res["policy"]["policy"]["parameters"]}
    for arm, s in summary.items():
        result[arm] = {"success_before": round(s["success_before"], 4), "success_after": round(s["success_final_mean"], 4),
                       "wall_s": round(s["wall_s"], 1),
                       "learner_forward_passes_per_step": round(s["learner_forward_passes_per_step"], 3)}
    (out / "summary.json").write_text(json.dumps({"summary": summary, "result": result}, indent=1, default=str))
    print("RESULT " + json.dumps(result, sort_keys=True))
    return 0


def compare_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="interq compare", description="the five arms (or --arms) over several seeds")
    _common_args(p, "runs/compare")
    p.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated presets (default: {','.join(ARMS)})")
    p.add_argument("--methods", default="", help="extra arms: comma-separated correction methods, each run as "
                   "q-interq's setting with that method (arm q-<method>), e.g. icepop,prefix_is,interq_uniform")
    p.add_argument("--seeds", default="0,1", help="comma-separated RL seeds (default: 0,1)")
    p.add_argument("--no-demo-defaults", action="store_true", help="do not apply the demo's small settings first")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    arms += [f"q-{m.strip()}" for m in args.methods.split(",") if m.strip() and f"q-{m.strip()}" not in arms]
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        print(f"interq compare: --seeds={args.seeds!r}: expected comma-separated integers", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    overrides = ([] if args.no_demo_defaults else DEMO_OVERRIDES) + list(args.overrides)
    res = run_arms(arms, seeds, overrides, out, fresh=args.fresh)
    summary = summarize(res["runs"], args.threshold)
    table = markdown_table(summary, args.threshold)
    budget = _load("q-interq", overrides).algo.budget
    plot_curves(res["runs"], out / "curves.png", "compare")
    curves = plot_mismatch(res["runs"], out / "mismatch.png", budget)
    cmd = "interq compare " + " ".join(argv)
    (out / "compare.md").write_text(f"Command: `{cmd}`\n\n{table}\n![curves](curves.png)\n![mismatch](mismatch.png)\n")
    (out / "summary.json").write_text(json.dumps({"summary": summary, "accumulation": curves}, indent=1, default=str))
    print(table)
    result = {"total_wall_s": round(time.perf_counter() - t0, 1), "seeds": seeds,
              **{a: {"final_mean": round(s["success_final_mean"], 4), "final_std": round(s["success_final_std"], 4),
                     "best": round(s["success_best"], 4), "late_regression": round(s["late_regression"], 4),
                     "learner_forward_passes_per_step": round(s["learner_forward_passes_per_step"], 3)}
                 for a, s in summary.items()}}
    print("RESULT " + json.dumps(result, sort_keys=True))
    return 0
