"""``interq demo`` and ``interq compare``: arms over seeds from one shared warm start; tables and plots.

Both write everything under ``--out`` (one run directory per arm and seed, each with ``config.yaml``,
``metrics.jsonl`` and checkpoints), a markdown table, PNG plots, a ``summary.json``, and end with one line
``RESULT {json}``. Re-running the same command resumes: the warm start and finished runs are reused, a killed
run continues from its last checkpoint, and a larger ``train.steps`` extends the runs. Reuse needs the same inputs:
the warm start its own config fields, each run its whole resolved config (``train.progress`` and
``train.tensorboard`` aside), both the same ``NUMERICS_VERSION`` (:mod:`interq.train.provenance`). Every directory
is checked before any work; if one differs the command stops with one line naming each directory and field
(``algo.budget: 0.5 -> 0.25``). ``--fresh`` moves those directories aside to ``<dir>.stale-<time>`` (deleting
nothing) and runs them again; the matching ones are still reused. ``compare --report-only`` runs nothing and also
tabulates runs of an older ``NUMERICS_VERSION``, saying so (``older_numerics``: the version, and the defaults that
moved since, as ``rollout.attention: sdpa -> sdpa_packed``).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

from interq.rundir import command as _writes_run
from interq.train.config import ARMS, ConfigError, build_config

# The base of the comparison study's settings (``study``, ``study-1k``, ``study-index`` below), on top of the household
# preset (which holds the measured learning settings: docs/results.md). The study's runs were made from these exact
# lists: a change here changes what their ``--setting`` resolves to.
STUDY_BASE_OVERRIDES = [
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

# The comparison study (docs/results.md "The study"), on top of STUDY_BASE_OVERRIDES: held-out task instances
# of the rooms seen in training (ALFWorld's valid_seen; 200 pick_and_place instances, one episode each), evaluated
# at the rollout temperature (the policy RL trains), groups of 8 episodes, GiGPO at lr 3e-4, 200 steps. Measured in
# docs/results.md ("Learning settings") before it was fixed here: lr 1e-3 eroded held-out success, 20-turn
# episodes cost 2.5x more per step. The policy has 4 layers (244k parameters): RL moved the 2-layer policy +5.5
# points in 200 steps, the 4-layer one +13-15 (docs/results.md, "Learning settings"). Since
# 2026-12-01 the policy writes its action as text (copying the object's name) instead of the
# action's number: held-out success 0.24 -> 0.50 at the warm start and +15 points in 100 RL steps (index: +13 in 200),
# and its W4A4-KV4 mismatch profile is closer to the warm-started SmolLM2's (docs/results.md, "Mismatch profiles and the matched regime"). The
# index-answer setting the first seeds of the study ran in stays available as ``study-index``.
STUDY_INDEX_OVERRIDES = [
    "model.num_layers=4",
    "env.env_kwargs={size: small, split_sizes: {valid_seen: 1200, valid_unseen: 600}}",
    "env.eval_split=valid_seen",
    "env.num_eval_tasks=200",
    "train.eval_temperature=1.0",
    "train.episodes_per_task=8",
    "algo.advantage=gigpo",
    "optim.lr=3e-4",
    "train.steps=200",
    "train.eval_every_steps=25",
    "train.checkpoint_every_steps=25",
]
STUDY_OVERRIDES = [*STUDY_INDEX_OVERRIDES, "env.action_format=text", "rollout.max_action_tokens=10"]
# The study with an evaluation that is not the noise: 1,000 held-out task instances (one episode each; a larger
# valid_seen split holds 1,000 pick_and_place instances, its first 200 being those of ``study``), evaluated before RL,
# every 50 steps and at the end. A success rate over 200 episodes has a standard error of about 0.033, as large as
# the effects the study asks about; over 1,000 about 0.015.
# A pack of 16,384 tokens holds more of a group's repeated turns than the default 4,096, so the learner computes
# fewer rows (docs/performance.md, "Study run"); the tiny policy's update then peaks near 1 GB. The lists of the
# recorded ``study`` and ``study-index`` runs keep the default.
LARGE_PACKS = "train.tokens_per_microbatch=16384"
STUDY_1K_OVERRIDES = [*STUDY_OVERRIDES, "env.env_kwargs={size: small, split_sizes: {valid_seen: 6600, valid_unseen: 600}}",
                      "env.num_eval_tasks=1000", "train.eval_every_steps=50", LARGE_PACKS]
# Settings of ``interq demo``: the study's text setting (4-layer policy writing its actions, 200 held-out valid_seen
# instances at T = 1, GiGPO at lr 3e-4, groups of 8) cut to DEMO_STEPS steps, starting from the warm start shipped in
# interq/policies/household_text (made from exactly these settings; ``interq demo --warm-start`` makes it again).
# Measured 2026-12-05 (2-core Intel Xeon, seed 0, NUMERICS_VERSION 5): held-out success 0.41 -> 0.645 (bf16) and
# 0.43 -> 0.60 (q-interq, W8A8-KV8), paired 95% intervals of the gains above +0.15 and +0.09; each arm about 200 CPU
# seconds of rollouts and learning plus seven evaluations of 200 episodes (docs/results.md, "The demo").
DEMO_STEPS = 60
DEMO_OVERRIDES = [*STUDY_BASE_OVERRIDES, *STUDY_OVERRIDES, f"train.steps={DEMO_STEPS}", "train.eval_every_steps=10",
                  f"train.checkpoint_every_steps={DEMO_STEPS}", LARGE_PACKS]
SETTINGS = {"demo": DEMO_OVERRIDES, "study": [*STUDY_BASE_OVERRIDES, *STUDY_OVERRIDES],
            "study-1k": [*STUDY_BASE_OVERRIDES, *STUDY_1K_OVERRIDES],
            "study-index": [*STUDY_BASE_OVERRIDES, *STUDY_INDEX_OVERRIDES], "none": []}

# Executor regimes of the comparison study. ``natural``: the arms' own W8A8-KV8 executor.
# ``matched``: a W4A4-KV4 executor, whose mismatch profile on the tiny household policy (per-token |delta|, growth of
# the prefix log-ratio, share of rows where InterQ's budget binds) is within a factor 2 of a warm-started
# SmolLM2-135M's W8A8-KV8 profile (docs/results.md, measured with ``interq mismatch``). A regime changes only the
# quantized (w8a8) arms; an arm with another executor (bf16) is the same run in every regime.
REGIMES: dict[str, list[str]] = {
    "natural": [],
    "matched": ["rollout.w_bits=4", "rollout.a_bits=4", "rollout.kv_bits=4"],
    # the mismatch-strength curve: the executor between W8A8-KV8 (natural) and W4A4-KV4 (matched), and past it
    **{f"w{b}a{b}kv{b}": [f"rollout.w_bits={b}", f"rollout.a_bits={b}", f"rollout.kv_bits={b}"] for b in (7, 6, 5, 3, 2)},
}
REGIME_EXECUTORS = {"natural": "W8A8-KV8", "matched": "W4A4-KV4 (mismatch matched to a warm-started SmolLM2's W8A8-KV8)"}
# What the comparison study found (docs/results.md, "The study"); the demo prints it beside its own table.
DEMO_FINDING = ("The full study (docs/results.md: this setting, 3 seeds x 200 steps, 200 held-out episodes each): under "
                "a W4A4-KV4 executor the arms whose learner runs the executor's quantization (q-align, q-interq) end "
                "14-16 points above q-naive and q-tis, and q-interq is not separated from q-align; under the W8A8-KV8 "
                "executor no arm separates.")


_CHECKED_ENVS: set[str] = set()  # env configs already checked against the env in this process


def _load(preset: str, overrides: list[str]):
    from interq.train.build import check_env
    from interq.train.config import to_dict

    try:
        cfg = build_config(preset, overrides)
        key = json.dumps(to_dict(cfg.env), sort_keys=True, default=str)
        if key not in _CHECKED_ENVS:
            check_env(cfg.env)  # env.name, env.env_kwargs, the splits, env.task_types: against the env itself
            _CHECKED_ENVS.add(key)
        return cfg
    except ConfigError as e:
        print(f"interq: invalid configuration: {e}", file=sys.stderr)
        raise SystemExit(2) from None


def arm_config(arm: str, overrides: list[str]):
    """An arm's config: a preset name (the five arms of spec §4, or a YAML path), or ``q-<method>`` for any other
    correction method of spec §4, which is q-interq's setting (W8A8-KV8 executor, aligned learner) with that
    method: ``q-icepop``, ``q-prefix_is``, ``q-interq_uniform``, ... A suffix ``-B<budget>`` sets InterQ's
    budget: ``q-interq-B0.25``, ``q-interq-Binf``."""
    import re

    from interq.train.config import CORRECTIONS, preset_names

    m = re.fullmatch(r"(.+)-B([0-9]*\.?[0-9]+(?:e-?[0-9]+)?|inf)", arm)
    if m and arm not in preset_names():
        return arm_config(m.group(1), [f"algo.budget={m.group(2)}", f"name={arm}", *overrides])
    if arm in preset_names() or arm.endswith((".yaml", ".yml")):
        return _load(arm, overrides)
    method = arm[2:] if arm.startswith("q-") else ""
    if method not in CORRECTIONS:
        print(f"interq: invalid configuration: arm {arm!r} is not accepted (unknown preset {arm!r}); choose a preset "
              f"{preset_names()} or q-<method> with method one of {list(CORRECTIONS)}", file=sys.stderr)
        raise SystemExit(2)
    return _load("q-interq", [f"algo.correction={method}", f"name={arm}", *overrides])


def _worker_init(parent_pid: int) -> None:
    """A ``--jobs`` worker process: the allocator's environment settled, and the worker stopped (SIGTERM: a run
    stops at its last checkpoint, as when interrupted) when the comparing process dies, killed or crashed, instead
    of training on as an orphan that holds its run directory. Linux only (``prctl``); elsewhere a no-op."""
    import os
    import signal

    from interq import allocator

    allocator.settle_environment()
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
    if os.getppid() != parent_pid:  # the parent died before the signal was asked for
        os.kill(os.getpid(), signal.SIGTERM)


def _train_one(cfg_dict: dict, run_dir: str, policy_dir: str) -> list[dict]:
    """One RL run in a worker process (``--jobs``): plain arguments in, the run's step records out."""
    from interq.train.config import RunConfig, from_dict
    from interq.train.pipeline import run_training

    return run_training(from_dict(RunConfig, cfg_dict), run_dir, policy_dir)


def plan_runs(arms: list[str], seeds: list[int], overrides: list[str], regimes: list[str]) -> dict:
    """Every (regime, arm, seed) of a comparison -> (run directory name, config). Validates all of them first.

    The ``natural`` regime's run of arm A, seed s lives in ``A-s<s>``; another regime's quantized run in
    ``A@<regime>-s<s>``; an arm whose executor is not quantized (bf16) is one run shared by every regime."""
    unknown = [r for r in regimes if r not in REGIMES]
    if unknown or not regimes:
        print(f"interq: invalid configuration: --regimes {unknown or regimes}: accepted {list(REGIMES)}", file=sys.stderr)
        raise SystemExit(2)
    quantized = {arm: arm_config(arm, overrides).rollout.executor == "w8a8" for arm in arms}
    plan = {}
    for regime in regimes:
        for arm in arms:
            label = arm if regime == "natural" or not quantized[arm] else f"{arm}@{regime}"
            for seed in seeds:
                extra = REGIMES[regime] if quantized[arm] else []
                cfg = arm_config(arm, [*overrides, *extra, f"train.seed={seed}", f"name={label}-s{seed}"])
                plan[(regime, arm, seed)] = (f"{label}-s{seed}", cfg)
    for _name, cfg in plan.values():  # the tables compare held-out success: a run without it has nothing to show
        if not (cfg.train.eval_every_steps > 0 and cfg.env.num_eval_tasks > 0):
            print(f"interq: invalid configuration: train.eval_every_steps={cfg.train.eval_every_steps} and "
                  f"env.num_eval_tasks={cfg.env.num_eval_tasks}: demo and compare need held-out evaluations (both > 0)",
                  file=sys.stderr)
            raise SystemExit(2)
    return plan


def run_arms(arms: list[str], seeds: list[int], overrides: list[str], out: Path, log=print, fresh: bool = False,
             regimes: list[str] | None = None, jobs: int = 1, report_only: bool = False) -> dict:
    """Shared warm start, then one RL run per (regime, arm, seed), ``jobs`` at a time.

    Returns ``{"by_regime": {regime: {arm: [records per seed]}}, "runs": <the first regime's>, ...}``. Before any
    work, every arm's config is validated and the warm start and every run directory are checked
    (:mod:`interq.train.provenance`): one :class:`~interq.train.provenance.StaleResultError` names all that differ,
    or with ``fresh`` each of them is moved aside and started again. ``report_only``: run nothing, read what the
    run directories hold (a run may be partial: its records end at the last logged step)."""
    from interq.train.logging import read_jsonl
    from interq.train.pipeline import prepare_policy, run_training
    from interq.train.provenance import (NUMERICS_VERSION, moved_defaults, older_version, resolved_elsewhere,
                                         run_differences, settle, stored_numerics_version, warm_start_differences,
                                         warm_start_identity)
    from interq.train.rl import MACHINE_LOG

    regimes = regimes or ["natural"]
    base = _load("household", overrides)
    plan = plan_runs(arms, seeds, overrides, regimes)
    unique = {name: cfg for name, cfg in plan.values()}
    start_policy = warm_start_identity(base)
    settle([(out / "warm_start", warm_start_differences(base, out / "warm_start", report=report_only)),
            *((out / name, run_differences(cfg, out / name, start_policy, report=report_only))
              for name, cfg in unique.items())],
           fresh and not report_only, log)
    records: dict[str, list[dict]] = {}
    warm_s, summary = 0.0, {}
    older: dict[str, dict] = {}  # report only: directories computed under an older numerics version
    if report_only:
        records = {name: read_jsonl(out / name / "metrics.jsonl") for name in unique}
        for name in ["warm_start", *unique]:
            version = stored_numerics_version(out / name)
            if older_version(version):
                older[name] = {"numerics_version": version,
                               "moved_defaults": [] if name == "warm_start" else moved_defaults(unique[name], out / name)}
        if older:
            log(f"[report] {len(older)} directories were computed under an older numerics version than this code's "
                f"({NUMERICS_VERSION}): reported as stored; this code would not reproduce them "
                "(interq.train.provenance.NUMERICS_VERSION says what changed)")
        elsewhere = {}
        for name, cfg in unique.items():
            for change in resolved_elsewhere(cfg, out / name):
                elsewhere.setdefault(change, []).append(name)
        for (field, stored, here), names in elsewhere.items():
            log(f"[report] {len(names)} runs record {field}={stored}, which `auto` resolves to {here} on this machine: "
                f"reported as stored; to resume or extend them here, pass {field}={stored} (e.g. {names[0]})")
        machines: dict[str, set[str]] = {}
        for name in unique:
            for rec in read_jsonl(out / name / MACHINE_LOG):  # one line per start or resume of the run
                machines.setdefault(f"{rec.get('cpu')} ({rec.get('cpu_class')})", set()).add(name)
        if machines:
            unrecorded = len(set(unique) - set().union(*machines.values()))
            log("[report] where the runs trained (each run's machine.jsonl): "
                + "; ".join(f"{len(names)} runs on {m}" for m, names in sorted(machines.items()))
                + (f"; {unrecorded} runs record no machine" if unrecorded else ""))
        if (out / "warm_start" / "policy_summary.json").is_file():
            summary = json.loads((out / "warm_start" / "policy_summary.json").read_text())
    else:
        t0 = time.perf_counter()
        policy_dir, summary = prepare_policy(base, out / "warm_start", log=log)
        warm_s = time.perf_counter() - t0
        log(f"[warm start] {summary['policy']} ({warm_s:.0f}s)")

        def done(name: str, recs: list[dict], ts: float) -> None:
            records[name] = recs
            ev = _evals(recs)
            log(f"[{name}] held-out success {ev[0][1]:.3f} -> {ev[-1][1]:.3f} ({time.perf_counter() - ts:.0f}s)" if ev
                else f"[{name}] done ({time.perf_counter() - ts:.0f}s)")

        if jobs <= 1:
            for name, cfg in unique.items():
                ts = time.perf_counter()
                done(name, run_training(cfg, out / name, policy_dir, log=log), ts)
        else:
            import multiprocessing as mp
            import os
            from concurrent.futures import ProcessPoolExecutor

            from interq.train.config import to_dict

            from interq import allocator

            ts = time.perf_counter()
            with allocator.for_python_workers(), ProcessPoolExecutor(
                    max_workers=jobs, mp_context=mp.get_context("spawn"), initializer=_worker_init,
                    initargs=(os.getpid(),)) as pool:
                futs = {name: pool.submit(_train_one, to_dict(cfg), str(out / name), str(policy_dir))
                        for name, cfg in unique.items()}
                for name, fut in futs.items():
                    done(name, fut.result(), ts)
    targets = {name: cfg.train.steps for name, cfg in unique.items()}
    progress = {name: (max((r.get("step", 0) for r in records.get(name, [])), default=None), targets[name]) for name in unique}
    # only finished runs enter the arms' statistics: an unfinished run's last evaluation is of another step
    by_regime: dict[str, dict[str, list[list[dict]]]] = {}
    seeds_of: dict[str, dict[str, list[int]]] = {}  # the seed of each run in by_regime, in the same order
    in_progress: dict[str, dict] = {}
    for (regime, arm, seed), (name, _cfg) in plan.items():
        done, target = progress[name]
        if done is not None and done >= target:
            by_regime.setdefault(regime, {}).setdefault(arm, []).append(records[name])
            seeds_of.setdefault(regime, {}).setdefault(arm, []).append(seed)
        elif done is not None:
            ev = _evals(records[name])
            in_progress[name] = {"step": done, "target": target, "success_before": ev[0][1] if ev else None,
                                 "last_eval_step": ev[-1][0] if ev else None, "last_eval": ev[-1][1] if ev else None}
    return {"by_regime": by_regime, "runs": by_regime.get(regimes[0], {}), "warm_start_s": warm_s, "policy": summary,
            "progress": progress, "in_progress": in_progress, "seeds": seeds_of, "older_numerics": older}


def _evals(recs: list[dict]) -> list[tuple[int, float]]:
    return [(r["step"], r["eval/success"]) for r in recs if "eval/success" in r]


def _mean(xs):
    xs = [x for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]
    return sum(xs) / len(xs) if xs else float("nan")


def _std(xs):
    """Sample standard deviation over seeds (n - 1 in the denominator)."""
    from interq.train.stats import sample_std

    return sample_std(xs)


WALL_KEYS = ("time/rollout", "time/learner", "time/sync", "time/eval")  # the phases of a step, one after another
CPU_KEYS = ("time/rollout_cpu", "time/learner_cpu")  # the trainer process's CPU seconds in rollout and learner


def _run_seconds(recs: list[dict]) -> float:
    """The run's RL wall time from its own step timings (rollout, learner, sync, eval; ``time/env`` is part of the
    rollout's): also right for a reused run."""
    return sum(r[k] for r in recs for k in WALL_KEYS if isinstance(r.get(k), (int, float)))


def _run_cpu_seconds(recs: list[dict]) -> float:
    """The CPU seconds of the run's rollouts and learner (the trainer process, all its threads); nan where its records
    do not have them."""
    vals = [r[k] for r in recs for k in CPU_KEYS if isinstance(r.get(k), (int, float))]
    return sum(vals) if vals else float("nan")


def _fwd_per_step(recs: list[dict]) -> float:
    return _mean([r["learner/forward_passes"] for r in recs if "learner/forward_passes" in r])


def _final_outcomes(recs: list[dict]) -> list[int] | None:
    """Per-episode outcomes (0/1) of the run's last held-out evaluation, or None if it did not log them."""
    last = [r for r in recs if "eval/success" in r][-1:]
    out = last[0].get("eval/outcomes") if last else None
    return [int(c) for c in out] if isinstance(out, str) and out else None


def summarize(runs: dict, threshold: float) -> dict:
    """Per arm: success before/final/best over seeds, ``ci95`` (t interval of the mean final success over seeds:
    the seed is the unit of replication; None for one seed), ``ci95_episodes`` (Wilson interval of the final success
    pooled over seeds x held-out episodes, which treats every episode as independent and so leaves the between-seed
    variance out), steps to ``threshold``, late regression (best minus final), costs, mismatch."""
    from interq.train.stats import seed_interval, wilson_interval

    out = {}
    for arm, seed_runs in runs.items():
        finals = [_evals(r)[-1][1] for r in seed_runs]
        befores = [_evals(r)[0][1] for r in seed_runs]
        bests = [max(s for _, s in _evals(r)) for r in seed_runs]
        reach = [next((st for st, s in _evals(r) if s >= threshold), None) for r in seed_runs]
        outcomes = [_final_outcomes(r) for r in seed_runs]
        pooled = [x for o in outcomes if o for x in o] if all(outcomes) else []
        seed_ci = seed_interval(finals)["ci95"] if len(finals) > 1 else None
        out[arm] = {
            "success_before": _mean(befores),
            "success_final_mean": _mean(finals), "success_final_std": _std(finals),
            "ci95": seed_ci,
            "ci95_episodes": list(wilson_interval(sum(pooled), len(pooled))) if pooled else None,
            "eval_episodes": len(pooled),
            "success_best": _mean(bests),
            "final_steps": [_evals(r)[-1][0] for r in seed_runs],
            "steps_to_threshold": _mean(reach) if any(x is not None for x in reach) else None,
            "reached_threshold": sum(x is not None for x in reach), "seeds": len(seed_runs),
            "late_regression": _mean([b - f for b, f in zip(bests, finals)]),
            "wall_s": _mean([_run_seconds(r) for r in seed_runs]),
            "cpu_s": _mean([_run_cpu_seconds(r) for r in seed_runs]),
            "learner_forward_passes_per_step": _fwd_per_step([x for r in seed_runs for x in r]),
            "abs_delta_mean": _mean([x.get("mismatch/abs_delta_mean") for r in seed_runs for x in r]),
            "k3": _mean([x.get("mismatch/k3") for r in seed_runs for x in r]),
            "budget_bound_frac": _mean([x.get("interq/budget_bound_frac") for r in seed_runs for x in r]),
        }
    return out


def _runs_of_common_seeds(runs: dict, seeds: dict | None, arms: list[str]) -> tuple[list[int] | None, dict] | None:
    """The runs of ``arms`` over the seeds all of them have (``seeds[arm]``: the seed of each of ``runs[arm]``, in
    order; without it, runs are paired by position and every arm needs as many). -> (the common seeds, or None when
    paired by position; ``{arm: [runs per seed]}``), or None when there is no run in common."""
    if seeds is not None and all(a in seeds for a in arms):
        common = sorted(set.intersection(*(set(seeds[a]) for a in arms)))
        picked = {a: [dict(zip(seeds[a], runs.get(a) or []))[x] for x in common] for a in arms}
    else:
        common, picked = None, {a: runs.get(a) or [] for a in arms}
        if len({len(v) for v in picked.values()}) != 1:
            return None
    return (common, picked) if picked[arms[0]] else None


def _aligned_finals(runs: dict, seeds: dict | None, arms: list[str]) -> tuple[list[int] | None, dict] | None:
    """The final held-out outcomes of ``arms`` over the seeds all of them have (``seeds[arm]``: the seed of each of
    ``runs[arm]``, in order; without it, runs are paired by position and every arm needs as many), so that episode i
    of seed s is the same task and sampling seed in every arm. -> (the common seeds, or None when paired by
    position; ``{arm: [outcomes per seed]}``), or None when there is no run in common, a run did not log its outcomes,
    or the runs' final steps or held-out sets differ (a partial run)."""
    matched = _runs_of_common_seeds(runs, seeds, arms)
    if matched is None:
        return None
    common, picked = matched
    finals = {a: [(_evals(r)[-1][0], _final_outcomes(r)) for r in picked[a]] for a in arms}
    every = [f for a in arms for f in finals[a]]
    if any(o is None for _, o in every) or len({st for st, _ in every}) != 1 or len({len(o) for _, o in every}) != 1:
        return None
    return common, {a: [o for _, o in finals[a]] for a in arms}


# the paper's claims, as paired differences of final held-out success (arm minus reference), and the two existing
# fixes against each other (alignment minus token-level TIS)
PAIRS = (("q-interq", "q-tis"), ("q-interq", "q-align"), ("q-interq", "bf16"), ("q-align", "bf16"),
         ("q-tis", "bf16"), ("q-naive", "bf16"), ("q-align", "q-tis"))


TARGET_MDE = 0.03  # the paired difference a decisive study should detect: 3 points of held-out success


def paired_differences(runs: dict, seeds: dict | None = None, target_mde: float = TARGET_MDE) -> dict:
    """``"A - B" -> {"diff", "ci95", ...}`` for the pairs of :data:`PAIRS` and every other arm against q-interq, over
    the seeds both arms have (``seeds[arm]``: the seed of each of ``runs[arm]``, in order; without it, runs are
    paired by position and both arms need as many), with per-episode outcomes of the same final step (episode i is
    the same task and sampling seed in every arm, :func:`interq.train.rl.evaluate`). ``seeds_for_mde``: the seeds
    the pair would need for an MDE of ``target_mde`` at the between-seed SD seen so far (None below 2 seeds). Values
    are not rounded (:func:`_rounded_tree` rounds them for JSON)."""
    from interq.train.stats import paired_difference, paired_difference_over_seeds, paired_t_over_seeds, seeds_for_mde

    pairs = list(PAIRS) + [(a, "q-interq") for a in runs if a not in {x for pr in PAIRS for x in pr}]
    out = {}
    for a, b in pairs:
        aligned = _aligned_finals(runs, seeds, [a, b])
        if aligned is None:
            continue
        common, finals = aligned
        fa, fb = finals[a], finals[b]
        res = paired_difference(fa, fb)
        over = paired_difference_over_seeds(fa, fb)
        t = paired_t_over_seeds(over["per_seed"])
        out[f"{a} - {b}"] = {"diff": res["diff"], "ci95": list(res["ci95"]), "ci95_seeds_and_tasks": list(over["ci95"]),
                             "ci95_paired_t": _rounded(t["ci95"], None), "p_sign_flip": t["p_sign_flip"],
                             "p_t": _rounded(t["p_t"], None), "mde": _rounded(t["mde"], None),
                             "seeds_for_mde": seeds_for_mde(t["sd"], target_mde) if t["n_seeds"] >= 2 else None,
                             "per_seed": list(over["per_seed"]), "seeds": res["n_seeds"], "episodes": res["n_episodes"]}
        if common is not None:
            out[f"{a} - {b}"]["seed_ids"] = common
        learning = learning_difference(runs, seeds, a, b)
        if learning:
            out[f"{a} - {b}"]["learning"] = learning
    return out


def learning_difference(runs: dict, seeds: dict | None, a: str, b: str) -> dict | None:
    """How much faster A learns than B: per seed, the mean held-out success over the evaluations after step 0 (the
    area under the learning curve from the first evaluation of RL on, in units of success), A minus B, with the
    paired t interval, the exact sign-flip p and the MDE over seeds; ``by_step``: the mean difference at each of those
    evaluations. Over the seeds both arms have; None unless every run evaluated at the same steps, at least one of
    them after step 0."""
    from interq.train.stats import paired_t_over_seeds

    matched = _runs_of_common_seeds(runs, seeds, [a, b])
    if matched is None:
        return None
    curves = [(_evals(ra), _evals(rb)) for ra, rb in zip(matched[1][a], matched[1][b])]
    steps = [[st for st, _ in c] for pair in curves for c in pair]
    later = [i for i, st in enumerate(steps[0]) if st > 0]
    if any(st != steps[0] for st in steps) or not later:
        return None
    per_seed = [sum(ca[i][1] - cb[i][1] for i in later) / len(later) for ca, cb in curves]
    t = paired_t_over_seeds(per_seed)
    return {"diff": t["diff"], "ci95_paired_t": _rounded(t["ci95"], None), "p_sign_flip": t["p_sign_flip"],
            "p_t": _rounded(t["p_t"], None), "mde": _rounded(t["mde"], None), "per_seed": per_seed,
            "seeds": len(per_seed), "steps": [steps[0][i] for i in later],
            "by_step": [sum(ca[i][1] - cb[i][1] for ca, cb in curves) / len(curves) for i in later]}


def _rounded(x, digits: int | None = 4):
    """Round a number or a list of numbers for JSON (``digits=None``: keep them whole); nan (one seed: no
    between-seed estimate) becomes None."""
    if isinstance(x, (list, tuple)):
        return None if any(math.isnan(v) for v in x) else [v if digits is None else round(v, digits) for v in x]
    return None if x is None or math.isnan(x) else (x if digits is None else round(x, digits))


def _rounded_tree(x, digits: int = 4):
    """Every float in nested dicts and lists rounded for the RESULT line and summary.json. Tables format the whole
    values: rounding a rounded value again can move the last digit (-0.081474 -> -0.0815 -> -0.082)."""
    if isinstance(x, dict):
        return {k: _rounded_tree(v, digits) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_rounded_tree(v, digits) for v in x]
    return round(x, digits) if isinstance(x, float) else x


# Aligned arms (the learner runs the executor's quantization) and unaligned quantized arms: the pooled contrast
ALIGNED, UNALIGNED = ("q-align", "q-interq"), ("q-naive", "q-tis")


def pooled_contrast(runs: dict, seeds: dict | None, group_a=ALIGNED, group_b=UNALIGNED) -> dict | None:
    """Do the arms of ``group_a`` end above those of ``group_b``, with the seed as the stratum? The mean over the
    seeds all of them finished of ``mean(final success of group_a) - mean(... of group_b)``, with the exact
    stratified permutation test (:func:`interq.train.stats.stratified_permutation_test`). None where an arm of
    either group has no comparable final evaluation."""
    from interq.train.stats import stratified_permutation_test

    arms = [*group_a, *group_b]
    if not all(a in runs for a in arms):
        return None
    aligned = _aligned_finals(runs, seeds, arms)
    if aligned is None:
        return None
    common, outcomes = aligned
    n_seeds = len(outcomes[arms[0]])
    rate = {a: [sum(o) / len(o) for o in outcomes[a]] for a in arms}
    res = stratified_permutation_test([([rate[a][s] for a in group_a], [rate[b][s] for b in group_b])
                                       for s in range(n_seeds)])
    every_seed = all(min(rate[a][s] for a in group_a) > max(rate[b][s] for b in group_b) for s in range(n_seeds))
    return {"groups": [list(group_a), list(group_b)], "diff": round(res["diff"], 4), "p_permutation": round(res["p"], 4),
            "relabellings": res["relabellings"], "every_a_above_every_b_in_every_seed": every_seed,
            "seeds": n_seeds, **({"seed_ids": common} if common else {})}


def executor_strength(regime: str) -> str:
    """The executor of a regime as ``w<bits>a<bits>kv<bits>`` (``natural`` -> ``w8a8kv8``, ``matched`` -> ``w4a4kv4``)."""
    bits = {"w": 8, "a": 8, "kv": 8}
    for o in REGIMES[regime]:
        key, _, value = o.partition("=")
        bits[key.removeprefix("rollout.").removesuffix("_bits")] = int(value)
    return f"w{bits['w']}a{bits['a']}kv{bits['kv']}"


def strength_curve(by_regime: dict, regimes: list[str]) -> dict | None:
    """Final success against the executor's strength: ``{strength: {arm: {final_mean, ci95, seeds}}}`` over the
    regimes run, quantized arms only (bf16 is the same run in every regime); None with fewer than two strengths."""
    curve: dict[str, dict] = {}
    for regime in regimes:
        arms = by_regime.get(regime) or {}
        entry = {a: {"final_mean": v["final_mean"], "ci95": v["ci95"], "seeds": v["seeds"]}
                 for a, v in arms.items() if a != "bf16"}
        if entry:
            curve.setdefault(executor_strength(regime), {}).update(entry)
    return curve if len(curve) >= 2 else None


def pooled_contrast_line(c: dict | None) -> str:
    if not c:
        return ""
    a, b = (" and ".join(g) for g in c["groups"])
    return (f"Pooled contrast, {a} minus {b} (seed as stratum, {c['seeds']} seeds): {c['diff']:+.3f}, exact stratified "
            f"permutation p = {c['p_permutation']:.4f} ({c['relabellings']} relabellings); every run of the first group "
            f"above every run of the second in every seed: {'yes' if c['every_a_above_every_b_in_every_seed'] else 'no'}\n")


def markdown_table(summary: dict, threshold: float) -> str:
    head = ("| arm | seeds | final step | success before | final success (mean ± sample SD) | 95% CI (t over seeds) | best | steps to "
            f"{threshold:.2f} | late regression | learner fwd/step | mean abs delta | budget binds | wall s | "
            "CPU s (rollout + learner) |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
    rows = []
    for arm, s in summary.items():
        reach = "never" if s["steps_to_threshold"] is None else f"{s['steps_to_threshold']:.1f} ({s['reached_threshold']}/{s['seeds']})"
        ci = "n/a" if not s.get("ci95") else f"[{s['ci95'][0]:.3f}, {s['ci95'][1]:.3f}]"
        steps = sorted(set(s.get("final_steps") or []))
        bound = s.get("budget_bound_frac")
        sd = "n/a" if s["seeds"] < 2 else f"{s['success_final_std']:.3f}"  # one seed has no sample SD
        cpu = s.get("cpu_s", math.nan)
        rows.append(f"| {arm} | {s['seeds']} | {'/'.join(map(str, steps))} | {s['success_before']:.3f} | "
                    f"{s['success_final_mean']:.3f} ± {sd} | {ci} | "
                    f"{s['success_best']:.3f} | {reach} | {s['late_regression']:.3f} | "
                    f"{s['learner_forward_passes_per_step']:.1f} | {s['abs_delta_mean']:.4f} | "
                    f"{'-' if bound is None or math.isnan(bound) else f'{bound:.2f}'} | {s['wall_s']:.0f} | "
                    f"{'-' if math.isnan(cpu) else f'{cpu:.0f}'} |")
    return head + "\n".join(rows) + "\n"


def paired_table(paired: dict, target_mde: float = TARGET_MDE) -> str:
    if not paired:
        return ""
    def interval(ci):
        return "n/a" if not ci else f"[{ci[0]:+.3f}, {ci[1]:+.3f}]"

    def verdict(v):
        ci, mde = v.get("ci95_paired_t"), v.get("mde")
        if not ci:
            return "one seed: no seed-level test"
        if ci[0] > 0 or ci[1] < 0:
            return "separated"
        return "not separated" + (f" (MDE {mde:.3f})" if mde is not None else "")

    def p(x):
        return "n/a" if x is None else f"{x:.3f}"

    def need(v):
        n = v.get("seeds_for_mde")
        return "n/a" if n is None else str(n)

    rows = [f"| {k} | {v['diff']:+.3f} | {interval(v.get('ci95_paired_t'))} | {p(v.get('p_sign_flip'))} | "
            f"{p(v.get('mde'))} | {need(v)} | {verdict(v)} | {interval(v.get('ci95_seeds_and_tasks'))} | {interval(v['ci95'])} | "
            + (" / ".join(f"{x:+.3f}" for x in v["per_seed"]) if v.get("per_seed") else "n/a")
            + f" | {v['seeds']} x {v['episodes']}"
            + (f" (seed{'s' if len(v['seed_ids']) > 1 else ''} {', '.join(map(str, v['seed_ids']))})"
               if "seed_ids" in v else "") + " |"
            for k, v in paired.items()]
    table = ("| paired difference (final held-out success) | mean | 95% CI (paired t over seeds) | sign-flip p (exact) | "
             f"MDE (80% power) | seeds for MDE {target_mde:g} | verdict | 95% CI (seeds and tasks bootstrap) | "
             "95% CI (tasks only) | per seed | seeds x episodes |\n|---|---|---|---|---|---|---|---|---|---|---|\n"
             + "\n".join(rows) + "\n")
    learning = {k: v["learning"] for k, v in paired.items() if v.get("learning")}
    if not learning:
        return table
    rows = [f"| {k} | {v['diff']:+.3f} | {interval(v.get('ci95_paired_t'))} | {p(v.get('p_sign_flip'))} | "
            f"{p(v.get('mde'))} | {verdict(v)} | " + " / ".join(f"{x:+.3f}" for x in v["by_step"]) + f" | {v['seeds']} |"
            for k, v in learning.items()]
    steps = {tuple(v["steps"]) for v in learning.values()}
    at = f"at steps {', '.join(map(str, steps.pop()))}" if len(steps) == 1 else "after step 0"
    return (table + "\n| paired difference (learning: mean held-out success over the evaluations "
            f"{at}) | mean | 95% CI (paired t over seeds) | sign-flip p (exact) | MDE (80% power) | verdict | "
            "mean difference at each of those steps | seeds |\n|---|---|---|---|---|---|---|---|\n" + "\n".join(rows)
            + "\n")


def budget_trend(runs: dict, seeds: dict | None, base_budget: float) -> dict | None:
    """Does final success follow InterQ's budget? The least-squares slope of final held-out success against
    ``log10(B)`` over q-interq (``base_budget``) and the finite ``q-interq-B<B>`` arms, over the seeds all of them
    finished, with a 95% interval resampling seeds and tasks (:func:`interq.train.stats.linear_trend`). None with
    fewer than 3 finite budgets that have comparable final evaluations (``q-interq-Binf`` is not on the axis: its
    paired difference with q-interq is in the paired table)."""
    import re

    from interq.train.stats import linear_trend

    levels = {}
    for arm in runs:
        m = re.fullmatch(r"q-interq-B(.+)", arm)
        b = float(m.group(1)) if m else (base_budget if arm == "q-interq" else None)
        if b is not None and math.isfinite(b) and b > 0:
            levels[arm] = b
    if len(levels) < 3:
        return None
    arms = sorted(levels, key=levels.get)
    aligned = _aligned_finals(runs, seeds, arms)
    if aligned is None:
        return None  # no common finished seed, or unequal final steps / held-out sets
    common, outcomes = aligned
    res = linear_trend([math.log10(levels[a]) for a in arms], [outcomes[a] for a in arms])
    return {"arms": arms, "budgets": [levels[a] for a in arms], "means": [round(x, 4) for x in res["means"]],
            "slope_per_decade": round(res["slope"], 4), "ci95_seeds_and_tasks": [round(x, 4) for x in res["ci95"]],
            "seeds": res["n_seeds"], "episodes": res["n_episodes"], **({"seed_ids": common} if common else {})}


def budget_trend_line(trend: dict | None) -> str:
    if not trend:
        return ""
    pts = ", ".join(f"B={b:g}: {m:.3f}" for b, m in zip(trend["budgets"], trend["means"]))
    lo, hi = trend["ci95_seeds_and_tasks"]
    return (f"Budget trend: final success {trend['slope_per_decade']:+.3f} per decade of B, 95% CI [{lo:+.3f}, {hi:+.3f}] "
            f"(seeds and tasks resampled; {trend['seeds']} seeds x {trend['episodes']} episodes; {pts})\n")


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
    from interq.train.cli_args import add_config_arguments

    add_config_arguments(p, preset=False)  # --help-config [SECTION], --force; the arms stand for a preset here
    p.add_argument("overrides", nargs="*", help="key.sub=value overrides applied to every arm (after the built-in ones)")


DEMO_POLICY = Path(__file__).resolve().parent.parent / "policies" / "household_text"
"""The demo's warm start, shipped with the package: made by ``interq demo --warm-start-only`` from DEMO_OVERRIDES
(its README says how; a test checks that its recorded inputs are what the demo's settings make)."""
_SHIPPED_MARK = "shipped_from.txt"  # in <out>/warm_start: this warm start is a copy of DEMO_POLICY


def _demo_warm_start(base, out: Path, make: bool, log=print) -> str:
    """Put the demo's warm start in ``out/warm_start`` before :func:`run_arms` looks there. -> where it comes from:
    ``shipped`` (a copy of :data:`DEMO_POLICY`, made from ``base``'s warm-start inputs by this code's numerics),
    ``made`` (run_arms makes it: ``make``, or the shipped one was made from other inputs), or ``kept`` (a warm
    start already there, which run_arms reuses or refuses)."""
    import os
    import shutil
    import tempfile

    from interq.train.provenance import move_aside, warm_start_differences

    ws = out / "warm_start"
    if ws.is_dir() and any(ws.iterdir()):
        if not (ws / _SHIPPED_MARK).is_file():
            return "kept"
        if not make and not warm_start_differences(base, ws):
            return "shipped"
        dest = move_aside(ws)  # a copy of a package file: nothing of the user's is lost
        log(f"[warm start] {ws}: a copy of the shipped policy, "
            f"{'not wanted (--warm-start)' if make else 'made from other settings'}, moved aside to {dest}")
    if make:
        return "made"
    differences = warm_start_differences(base, DEMO_POLICY)
    if not (DEMO_POLICY / "policy_summary.json").is_file() or differences:
        log(f"[warm start] the shipped policy {DEMO_POLICY} was not made from these settings "
            f"({', '.join(differences) or 'missing'}): making the warm start (several minutes)")
        return "made"
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out, prefix=".warm_start."))
    try:
        for f in DEMO_POLICY.iterdir():
            if f.is_file() and f.suffix != ".md":
                shutil.copyfile(f, tmp / f.name)
        (tmp / _SHIPPED_MARK).write_text(f"{DEMO_POLICY}\n")
        if ws.exists():
            ws.rmdir()  # empty
        os.replace(tmp, ws)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log(f"[warm start] the shipped policy {DEMO_POLICY.name} (made from these settings; --warm-start makes it again)")
    return "shipped"


def _gain(recs: list[dict]) -> dict | None:
    """Final minus first held-out success of one run, paired: episode i is the same task and sampling seed at every
    evaluation (:func:`interq.train.rl.evaluate`), so the interval resamples tasks
    (:func:`interq.train.stats.paired_difference`). None when the outcomes were not logged."""
    from interq.train.stats import paired_difference

    evals = [r for r in recs if isinstance(r.get("eval/outcomes"), str) and r["eval/outcomes"]]
    if len(evals) < 2 or len(evals[0]["eval/outcomes"]) != len(evals[-1]["eval/outcomes"]):
        return None
    first, last = ([int(c) for c in r["eval/outcomes"]] for r in (evals[0], evals[-1]))
    res = paired_difference([last], [first])
    return {"diff": round(res["diff"], 4), "ci95": [round(x, 4) for x in res["ci95"]], "episodes": len(first),
            "steps": [evals[0]["step"], evals[-1]["step"]]}


@_writes_run("demo", "runs/demo")  # --out checked and locked before any work (interq.rundir)
def demo_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="interq demo", description="short RL runs of bf16 and q-interq side by side in the "
                                "comparison study's household setting, from the warm start shipped with interq; prints "
                                "a table, writes plots, ends with RESULT {json}")
    _common_args(p, "runs/demo")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--regime", default="natural", choices=sorted(REGIMES), help="executor regime of the quantized arm: "
                   "natural (W8A8-KV8, default) or matched (W4A4-KV4, the study's realistic-mismatch regime)")
    p.add_argument("--jobs", type=int, default=2, help="arms trained at the same time, one process each (default: 2)")
    p.add_argument("--warm-start", action="store_true", help="make the warm start from the demo's settings (SFT on "
                   "expert demos, several minutes) instead of copying the one shipped with interq")
    p.add_argument("--warm-start-only", action="store_true", help="make the warm start into <out>/warm_start and stop "
                   "(how the shipped one was made: see interq/policies/household_text/README.md)")
    args = p.parse_args(argv)
    if args.help_config is not None:
        from interq.train.cli_args import print_config_help

        return print_config_help(args.help_config)
    if args.jobs < 1:
        print(f"interq demo: --jobs={args.jobs}: expected an integer >= 1", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    out = Path(args.out)
    overrides = [*DEMO_OVERRIDES, *args.overrides]
    arms = ["bf16", "q-interq"]
    base = _load("household", overrides)
    if args.warm_start_only:
        from interq.train.pipeline import prepare_policy

        policy_dir, summary = prepare_policy(base, out / "warm_start", fresh=args.fresh)
        print(json.dumps({"policy_dir": str(policy_dir), **summary}, default=str))
        return 0
    plan_runs(arms, [args.seed], overrides, [args.regime])  # every arm's config checked before anything is written
    origin = _demo_warm_start(base, out, args.warm_start)
    res = run_arms(arms, [args.seed], overrides, out, fresh=args.fresh, regimes=[args.regime], jobs=args.jobs)
    out.mkdir(parents=True, exist_ok=True)  # (after run_arms: an invalid configuration leaves nothing behind)
    summary = summarize(res["runs"], args.threshold)
    gains = {arm: _gain(seed_runs[0]) for arm, seed_runs in res["runs"].items()}
    executor = REGIME_EXECUTORS.get(args.regime, " ".join(REGIMES[args.regime]))
    steps = base.train.steps
    lines = [f"Regime `{args.regime}`: q-interq's executor is {executor}. {steps} RL steps from the "
             f"{'shipped ' if origin == 'shipped' else ''}warm start, {base.train.tasks_per_step} tasks x "
             f"{base.train.episodes_per_task} episodes a step, seed {args.seed}.\n"]
    for arm, g in gains.items():
        if g:
            lines.append(f"- {arm}: held-out success {summary[arm]['success_before']:.3f} -> "
                         f"{summary[arm]['success_final_mean']:.3f}, {g['diff']:+.3f} (95% CI [{g['ci95'][0]:+.3f}, "
                         f"{g['ci95'][1]:+.3f}], the same {g['episodes']} task instances and sampling seeds at step "
                         f"{g['steps'][0]} and {g['steps'][1]})")
    table = "\n".join(lines) + "\n\n" + markdown_table(summary, args.threshold) + f"\n{DEMO_FINDING}\n"
    (out / "demo.md").write_text(table)
    plot_curves(res["runs"], out / "demo.png", "demo")
    budget = _load("q-interq", overrides).algo.budget
    plot_mismatch(res["runs"], out / "mismatch.png", budget)
    total = time.perf_counter() - t0
    print(table)
    print(f"plots: {out / 'demo.png'}, {out / 'mismatch.png'}; warm start: {origin} ({res['warm_start_s']:.0f}s); "
          f"total {total:.0f}s")
    result = {"total_wall_s": round(total, 1), "warm_start": origin, "warm_start_s": round(res["warm_start_s"], 1),
              "regime": args.regime, "steps": steps, "policy_parameters": res["policy"]["policy"]["parameters"]}
    for arm, s in summary.items():
        result[arm] = {"success_before": round(s["success_before"], 4), "success_after": round(s["success_final_mean"], 4),
                       "gain_ci95": gains[arm]["ci95"] if gains[arm] else None, "eval_episodes": s["eval_episodes"],
                       "wall_s": round(s["wall_s"], 1), "cpu_s": _rounded(s["cpu_s"], 1),
                       "learner_forward_passes_per_step": round(s["learner_forward_passes_per_step"], 3)}
    (out / "summary.json").write_text(json.dumps({"summary": summary, "gains": gains, "result": result}, indent=1,
                                                 default=str))
    print("RESULT " + json.dumps(result, sort_keys=True))
    return 0


def in_progress_table(runs: dict) -> str:
    """The unfinished runs (left out of the arms' statistics) with their last held-out evaluation."""
    def f(x):
        return "n/a" if x is None else f"{x:.3f}"
    rows = [f"| {n} | {r['step']}/{r['target']} | {f(r['success_before'])} | "
            f"{'n/a' if r['last_eval_step'] is None else r['last_eval_step']} | {f(r['last_eval'])} |"
            for n, r in sorted(runs.items())]
    return ("Runs not finished (not in the statistics above):\n\n| run | step | success before | last evaluated step | "
            "success there |\n|---|---|---|---|---|\n" + "\n".join(rows) + "\n")


def _csv(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


@_writes_run("compare", "runs/compare")  # --out checked and locked before any work (interq.rundir)
def compare_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="interq compare", description="the five arms (or --arms) over several seeds and "
                                "executor regimes; markdown table with 95%% intervals, paired differences, learning "
                                "curves, mismatch plots; ends with RESULT {json}")
    _common_args(p, "runs/compare")
    p.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated presets (default: {','.join(ARMS)})")
    p.add_argument("--methods", default="", help="extra arms: comma-separated correction methods, each run as "
                   "q-interq's setting with that method (arm q-<method>), e.g. icepop,prefix_is,interq_uniform")
    p.add_argument("--budgets", default="", help="extra arms: comma-separated InterQ budgets B, each run as q-interq "
                   "with algo.budget=B (arm q-interq-B<B>), e.g. 0.1,0.25,1,inf")
    p.add_argument("--regimes", default="natural", help=f"comma-separated executor regimes {list(REGIMES)} "
                   "(default: natural); a regime changes only the quantized arms, bf16 runs once")
    p.add_argument("--seeds", default="0,1", help="comma-separated RL seeds (default: 0,1)")
    p.add_argument("--jobs", type=int, default=1, help="runs trained at the same time, one process each (default: 1)")
    p.add_argument("--target-mde", type=float, default=TARGET_MDE, help="the paired difference of final held-out "
                   "success the study should detect at 80%% power: the report says how many seeds each pair needs for "
                   f"it at the seed-to-seed spread seen so far (default: {TARGET_MDE})")
    p.add_argument("--report-only", action="store_true", help="train nothing: tabulate what the run directories "
                   "hold now (partial runs are marked by their final step; runs of an older numerics version are "
                   "read and named)")
    p.add_argument("--setting", default="demo", choices=sorted(SETTINGS), help="built-in overrides applied first: demo "
                   f"(the demo's: the study's text setting, {DEMO_STEPS} steps; default), study (the comparison "
                   "study's: text actions), study-index "
                   "(the study's first setting: the action's number), none")
    p.add_argument("--no-demo-defaults", action="store_true", help="same as --setting none")
    args = p.parse_args(argv)
    if args.help_config is not None:
        from interq.train.cli_args import print_config_help

        return print_config_help(args.help_config)
    t0 = time.perf_counter()
    arms = _csv(args.arms)
    arms += [a for a in (f"q-{m}" for m in _csv(args.methods)) if a not in arms]
    arms += [a for a in (f"q-interq-B{b}" for b in _csv(args.budgets)) if a not in arms]
    try:
        seeds = [int(s) for s in _csv(args.seeds)]
    except ValueError:
        print(f"interq compare: --seeds={args.seeds!r}: expected comma-separated integers", file=sys.stderr)
        return 2
    if not seeds or not arms:  # nothing to train: never a warm start and an empty table over the last one
        print(f"interq compare: --{'seeds' if not seeds else 'arms'}={args.seeds if not seeds else args.arms!r}: "
              "expected at least one", file=sys.stderr)
        return 2
    if args.jobs < 1:
        print(f"interq compare: --jobs={args.jobs}: expected an integer >= 1", file=sys.stderr)
        return 2
    if not 0.0 < args.target_mde < 1.0:
        print(f"interq compare: --target-mde={args.target_mde}: expected a difference of success between 0 and 1",
              file=sys.stderr)
        return 2
    regimes = _csv(args.regimes)
    out = Path(args.out)
    overrides = SETTINGS["none" if args.no_demo_defaults else args.setting] + list(args.overrides)
    res = run_arms(arms, seeds, overrides, out, fresh=args.fresh, regimes=regimes, jobs=args.jobs,
                   report_only=args.report_only)
    out.mkdir(parents=True, exist_ok=True)  # (after run_arms: an invalid configuration leaves nothing behind)
    missing = [n for n, (done, target) in res["progress"].items() if done is None or done < target]
    not_run = [n for n in missing if res["progress"][n][0] is None]  # no records: never started in this directory
    runs_count = {"planned": len(res["progress"]), "finished": len(res["progress"]) - len(missing),
                  "unfinished": len(missing) - len(not_run), "not_run": len(not_run)}
    budget = _load("q-interq", overrides).algo.budget
    cmd = "interq compare " + " ".join(argv)
    md = [f"Command: `{cmd}`\n"]
    if missing:
        md.append(f"**Partial**: {len(missing)} of {len(res['progress'])} runs have not reached their last step: "
                  + ", ".join(f"{n} ({res['progress'][n][0] if res['progress'][n][0] is not None else 'not started'}"
                              f"/{res['progress'][n][1]})" for n in missing) + "\n")
    older = res["older_numerics"]
    if older:
        from interq.train.provenance import NUMERICS_VERSION

        versions = sorted({str(o["numerics_version"]) for o in older.values()})
        moved = sorted({m for o in older.values() for m in o["moved_defaults"]})
        md.append(f"**Older numerics**: {len(older)} directories were computed under numerics version "
                  f"{', '.join(versions)} (this code: {NUMERICS_VERSION}); their records are reported as stored, "
                  "and this code would not reproduce them"
                  + (f"; they ran at their version's defaults where today's differ: {'; '.join(moved)}" if moved else "")
                  + ".\n")
        print(md[-1])
    result = {"total_wall_s": round(time.perf_counter() - t0, 1), "seeds": seeds, "partial": bool(missing),
              "runs": runs_count,
              "regimes": {}, "paired": {}, "target_mde": args.target_mde}
    if older:
        result["older_numerics"] = {n: older[n] for n in sorted(older)}
    dump = {"regimes": {}, "paired": {}, "accumulation": {}, "progress": res["progress"]}
    for regime, runs in res["by_regime"].items():
        summary = summarize(runs, args.threshold)
        paired = paired_differences(runs, res["seeds"].get(regime), args.target_mde)
        sfx = "" if regimes == ["natural"] else f"_{regime}"
        plot_curves(runs, out / f"curves{sfx}.png", f"compare ({regime})")
        curves = plot_mismatch(runs, out / f"mismatch{sfx}.png", budget)
        table = markdown_table(summary, args.threshold)
        ptable = paired_table(paired, args.target_mde)
        trend = budget_trend(runs, res["seeds"].get(regime), budget)
        contrast = pooled_contrast(runs, res["seeds"].get(regime))
        md += [f"## Regime `{regime}`: {' '.join(REGIMES[regime]) or 'the arms as configured (W8A8-KV8)'}\n", table,
               ptable, pooled_contrast_line(contrast), budget_trend_line(trend),
               f"![curves](curves{sfx}.png)\n![mismatch](mismatch{sfx}.png)\n"]
        print(f"regime {regime}\n{table}{ptable}{pooled_contrast_line(contrast)}{budget_trend_line(trend)}")
        if contrast:
            result.setdefault("pooled", {})[regime] = contrast
        dump["regimes"][regime], dump["accumulation"][regime] = summary, curves
        dump["paired"][regime] = _rounded_tree(paired)
        if trend:
            result.setdefault("budget_trend", {})[regime] = trend
        result["regimes"][regime] = {a: {"final_mean": round(s["success_final_mean"], 4),
                                         "final_std": round(s["success_final_std"], 4),
                                         "ci95": None if s["ci95"] is None else _rounded(s["ci95"]),
                                         "ci95_episodes": None if s["ci95_episodes"] is None else _rounded(s["ci95_episodes"]),
                                         "best": round(s["success_best"], 4),
                                         "late_regression": round(s["late_regression"], 4), "seeds": s["seeds"],
                                         "wall_s": round(s["wall_s"], 1), "cpu_s": _rounded(s["cpu_s"], 1),
                                         "final_steps": s["final_steps"],
                                         "learner_forward_passes_per_step": round(s["learner_forward_passes_per_step"], 3)}
                                     for a, s in summary.items()}
        result["paired"][regime] = _rounded_tree(paired)
    curve = strength_curve(result["regimes"], regimes)
    if curve:
        result["curve"] = curve
    if res["in_progress"]:
        md.append(in_progress_table(res["in_progress"]))
        print(in_progress_table(res["in_progress"]))
    result["in_progress"] = res["in_progress"]
    (out / "compare.md").write_text("\n".join(md))
    (out / "summary.json").write_text(json.dumps(dump, indent=1, default=str))
    if missing:
        not_run_said = f", {len(not_run)} not run" if not_run else ""
        print(f"partial: {runs_count['unfinished']} of {runs_count['planned']} runs unfinished{not_run_said} "
              f"({', '.join(missing)})")
    print("RESULT " + json.dumps(result, sort_keys=True))
    return 0
