"""Environment throughput and the household/ALFWorld fidelity shares (issue 5, item 8).

Measured in one run on this machine, driven by each environment's expert:

- ``household``: steps per second, single process, and through ``EnvPool`` (2 worker processes);
- generated ALFWorld games on the real engine: steps per second (``step`` calls only; the game load
  at ``reset`` is reported apart as ``alfworld_reset_s``), with ALFWorld's handcoded expert on and
  off (off is what RL rollouts pay), single process and through the pool; the expert's success rate;
- ScienceWorld: steps per second of the fast step path along gold paths, the same with valid actions
  listed on every step (ScienceWorld's own ``env.step`` behaviour), JVM start-up, and through the pool;
- the fidelity check (``interq.envs.alfworld.fidelity``): ``--fidelity-per-type`` household tasks of
  each of the six types walked in both engines.

The last line is ``RESULT {json}``. Absolute numbers depend on the machine and its load; the run
records both (``machine``, ``load_avg``).

    .venv/bin/python benchmarks/bench_envs.py [--fidelity-per-type 50] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time


def _episodes(env, tasks, max_steps=None, expert_env=None):
    """Play each task with the env's expert; returns (steps, step seconds, reset seconds, wins, episodes)."""
    steps = wins = 0
    t_step = t_reset = 0.0
    for t in tasks:
        t0 = time.perf_counter()
        env.reset(t)
        t_reset += time.perf_counter() - t0
        while True:
            a = env.expert_action()
            if a is None:
                break
            t0 = time.perf_counter()
            r = env.step(a)
            t_step += time.perf_counter() - t0
            steps += 1
            if r.terminated or r.truncated:
                wins += bool(r.info.get("won"))
                break
    return steps, t_step, t_reset, wins, len(tasks)


def _replay(env, tasks, plans):
    """Replay recorded action lists (no expert); returns (steps, step seconds, reset seconds)."""
    steps, t_step, t_reset = 0, 0.0, 0.0
    for t, plan in zip(tasks, plans):
        t0 = time.perf_counter()
        env.reset(t)
        t_reset += time.perf_counter() - t0
        for a in plan:
            t0 = time.perf_counter()
            r = env.step(a)
            t_step += time.perf_counter() - t0
            steps += 1
            if r.terminated or r.truncated:
                break
    return steps, t_step, t_reset


def _record(env, tasks):
    plans, wins = [], 0
    for t in tasks:
        env.reset(t)
        plan = []
        while (a := env.expert_action()) is not None:
            plan.append(a)
            r = env.step(a)
            if r.terminated or r.truncated:
                wins += bool(r.info.get("won"))
                break
        plans.append(plan)
    return plans, wins


def _pool_steps(name, tasks, num_envs=2, **kwargs):
    """Steps per second through EnvPool (expert actions fetched from the workers, timed with the steps)."""
    try:
        from interq.envs.pool import EnvPool
    except ImportError as e:
        return None, f"interq.envs.pool unavailable: {e}"
    pool = EnvPool.from_name(name, num_envs=num_envs, step_timeout_s=600.0, **kwargs)
    try:
        steps, queue = 0, list(tasks)
        t0 = time.perf_counter()
        while queue:
            batch = [queue.pop(0) if queue else None for _ in range(num_envs)]
            pool.reset_batch(batch)
            while any(pool.active):
                acts = pool.expert_actions()
                acts = [a if (a is not None and act) else ("look" if act else None)
                        for a, act in zip(acts, pool.active)]
                res = pool.step_batch(acts)
                steps += sum(r is not None for r in res)
        dt = time.perf_counter() - t0
        return steps / dt, None
    finally:
        pool.close()


def bench_household(n_tasks):
    from interq.envs import make_env

    env = make_env("household", split_sizes={"train": n_tasks})
    tasks = env.tasks("train")
    steps, t_step, t_reset, wins, n = _episodes(env, tasks)
    pool_sps, why = _pool_steps("household", tasks[: max(8, n_tasks // 4)], split_sizes={"train": n_tasks})
    return {"household_steps_per_s": steps / (t_step + t_reset), "household_step_only_steps_per_s": steps / t_step,
            "household_episodes": n, "household_expert_success": wins / n,
            "household_pool_steps_per_s": pool_sps, "household_pool_note": why}


def bench_alfworld(n_per_type, cache):
    try:
        from interq.envs.alfworld import AlfworldEnv
        env = AlfworldEnv(source="generated", cache_dir=cache, split_sizes={"train": 6 * n_per_type})
    except ImportError as e:
        return {"alfworld_steps_per_s": None, "alfworld_note": f"alfworld extra missing: {e}"}
    tasks = env.tasks("train")
    steps, t_step, t_reset, wins, n = _episodes(env, tasks)
    # expert off (RL rollouts): replay the winning plans without the expert
    noexp = AlfworldEnv(source="generated", cache_dir=cache, split_sizes={"train": 6 * n_per_type}, expert=False)
    plans, _w = _record(env, tasks[:6])
    s2, t2, r2 = _replay(noexp, tasks[:6], plans)
    unfast = AlfworldEnv(source="generated", cache_dir=cache, split_sizes={"train": 6 * n_per_type}, expert=False,
                         fast=False)
    from interq.envs.alfworld import speedup
    speedup.uninstall()
    s3, t3, _ = _replay(unfast, tasks[:2], plans[:2])
    speedup.install()
    pool_sps, why = _pool_steps("alfworld", tasks[:4], source="generated", cache_dir=cache,
                                split_sizes={"train": 6 * n_per_type}, expert=True)
    return {"alfworld_steps_per_s": s2 / t2, "alfworld_expert_on_steps_per_s": steps / t_step,
            "alfworld_without_speedup_steps_per_s": s3 / t3,
            "alfworld_reset_s": t_reset / n, "alfworld_episodes": n, "alfworld_expert_success": wins / n,
            "alfworld_pool_steps_per_s": pool_sps, "alfworld_pool_note": why}


def bench_scienceworld(task_names, n_var):
    try:
        from interq.envs.scienceworld import ScienceWorldEnv
        t0 = time.perf_counter()
        env = ScienceWorldEnv(task_names=task_names, max_variations=n_var)
        start = time.perf_counter() - t0
    except ImportError as e:
        return {"scienceworld_steps_per_s": None, "scienceworld_note": f"scienceworld extra missing: {e}"}
    tasks = env.tasks("train")
    steps, t_step, t_reset, wins, n = _episodes(env, tasks)
    env.close()
    slow = ScienceWorldEnv(task_names=task_names, max_variations=1, admissible=True)
    s2, t2, _, _, _ = _episodes(slow, slow.tasks("train")[:2])
    slow.close()
    pool_sps, why = _pool_steps("scienceworld", tasks[:4], task_names=task_names, max_variations=n_var)
    return {"scienceworld_steps_per_s": steps / t_step, "scienceworld_with_valid_actions_steps_per_s": s2 / t2,
            "scienceworld_start_s": start, "scienceworld_reset_s": t_reset / n, "scienceworld_episodes": n,
            "scienceworld_gold_success": wins / n, "scienceworld_pool_steps_per_s": pool_sps,
            "scienceworld_pool_note": why}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fidelity-per-type", type=int, default=50)
    ap.add_argument("--alfworld-per-type", type=int, default=2)
    ap.add_argument("--household-tasks", type=int, default=300)
    ap.add_argument("--quick", action="store_true", help="small sizes (smoke run)")
    args = ap.parse_args()
    if args.quick:
        args.fidelity_per_type, args.alfworld_per_type, args.household_tasks = 1, 1, 30
    out = {"machine": f"{platform.machine()} {os.cpu_count()} cpus, {platform.python_implementation()} "
                      f"{platform.python_version()}", "load_avg_start": os.getloadavg()[0]}
    t_all = time.perf_counter()
    out.update(bench_household(args.household_tasks))
    print(json.dumps({k: v for k, v in out.items() if k.startswith("household")}), file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory(prefix="interq-bench-envs-") as cache:
        out.update(bench_alfworld(args.alfworld_per_type, cache))
        print(json.dumps({k: v for k, v in out.items() if k.startswith("alfworld")}), file=sys.stderr, flush=True)
        out.update(bench_scienceworld(["find-living-thing", "boil", "melt"], 2))
        print(json.dumps({k: v for k, v in out.items() if k.startswith("science")}), file=sys.stderr, flush=True)
        try:
            from interq.envs.alfworld.fidelity import run_fidelity
            rep = run_fidelity(args.fidelity_per_type, cache_dir=cache, progress=True)
            out.update({"fidelity_tasks": rep.tasks, "fidelity_success_agree": rep.success_agree,
                        "fidelity_outcome_agree": rep.outcome_agree, "fidelity_admissible_agree": rep.admissible_agree,
                        "fidelity_text_agree": rep.text_agree, "fidelity_per_type": rep.per_type,
                        "fidelity_disagreements": rep.disagreements[:5], "fidelity_s": rep.seconds})
        except ImportError as e:
            out.update({"fidelity_success_agree": None, "fidelity_admissible_agree": None,
                        "fidelity_note": f"alfworld extra missing: {e}"})
    out["load_avg_end"] = os.getloadavg()[0]
    out["total_s"] = time.perf_counter() - t_all
    print("RESULT " + json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
