"""Environment throughput, parallel workers, the household/ALFWorld fidelity shares and one policy on two engines
(docs/environments.md, docs/performance.md).

Measured in one run on this machine:

- ``household``: steps per second, single process, and through ``EnvPool`` (2 worker processes), expert-driven;
- generated ALFWorld games on the real engine: steps per second (``step`` calls only; the game load at ``reset``
  is reported apart as ``alfworld_reset_s``), with ALFWorld's handcoded expert on and off (off is what RL rollouts
  pay), and without the TextWorld speed-up; the expert's success rate;
- ScienceWorld: steps per second of the fast step path along gold paths, the same with valid actions listed on
  every step (ScienceWorld's own ``env.step`` behaviour), JVM start-up;
- **episodes per second through ``EnvPool`` with 1, 2 and 4 worker processes against in-process stepping**
  for ALFWorld and ScienceWorld, the same fixed tasks and policy in every configuration: ALFWorld
  plays ``--pool-episodes`` generated games (full ALFRED rooms) with a random-admissible policy seeded by (task,
  step) for ``--pool-steps`` steps, ScienceWorld plays the gold paths of ``--pool-episodes`` variations. Each
  engine first plays ``--pool-warmup-passes`` x ``--pool-episodes`` episodes untimed (default 1; in-process that is
  one pass over the episodes, a pool of N workers plays N passes, since each worker gets 1/N of a pass; 0: one
  untimed reset per environment only): a pool is long-lived in training, and a fresh engine is slower than a warm
  one (ScienceWorld's JVM compiles its hot code during the first episodes: 0.98 -> 1.52 episodes/s from the first
  to the second pass of one worker); its start-up is reported apart as ``*_pool_start_s``. Then
  the timer covers every reset and step of one more pass. A pool steps its slots in lockstep and resets
  them as a batch (``reset_batch``), so episodes run in waves of N. ``*_pool_speedup`` = the best worker count's
  episodes/s over in-process's; ``*_pool_same_outcomes``: every configuration played every episode the same
  (steps and outcome) as in-process; ``*_pool_cores_used``: CPU seconds of this process and its live descendants
  (workers, ScienceWorld's JVMs) per wall second over each configuration's whole life: how much CPU it actually got
  (on a machine busy with other work, more workers cannot help if this does not grow);
- the fidelity check (``interq.envs.alfworld.fidelity``): ``--fidelity-per-type`` household tasks of each of the
  six types walked in both engines (the full report: ``--fidelity-per-type 50``);
- one policy on two engines (``scripts/cross_engine_eval.py``): the household policy ``--policy`` (default the
  comparison study's warm start, ``runs/study/warm_start``) on its first ``--cross-engine-tasks`` held-out
  instances in household and in ALFWorld with the same seeds; ``cross_engine_success_diff`` = household minus
  ALFWorld success (None, with a note, when the policy directory is missing);
- ``env.overlap``: the study's text-setting household policy (``--overlap-policy``) rolled out as
  the trainer does, ``--overlap-episodes`` episodes in as many EnvPool workers whose environments take
  ``--overlap-latency-ms`` a step (``LatencyEnv``: a slow engine's latency without its CPU, so the measure holds on a
  busy machine), overlap off and on interleaved: wall seconds, the share spent waiting for environments,
  ``overlap_speedup`` (the best latency's) and ``overlap_same_episodes``.

The last line is ``RESULT {json}``, with ``machine`` (``interq.machine.machine_info()`` at the start,
``load_avg_end`` at the end): absolute numbers depend on the machine and its load.

    .venv/bin/python benchmarks/bench_envs.py [--fidelity-per-type 5] [--pool-episodes 8] [--pool-warmup-passes 1] [--workers 1,2,4] [--sections ...] [--quick]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import resource
import sys
import tempfile
import time
from pathlib import Path

from interq.machine import describe, load_avg, machine_info


def _episodes(env, tasks, plans=None):
    """Play each task with the env's expert; returns (steps, step seconds, reset seconds, wins, episodes).
    ``plans``: a list that receives each episode's actions (replayed without the expert)."""
    steps = wins = 0
    t_step = t_reset = 0.0
    for t in tasks:
        t0 = time.perf_counter()
        env.reset(t)
        t_reset += time.perf_counter() - t0
        if plans is not None:
            plans.append([])
        while True:
            a = env.expert_action()
            if a is None:
                break
            if plans is not None:
                plans[-1].append(a)
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
    plans: list = []
    steps, t_step, t_reset, wins, n = _episodes(env, tasks, plans)
    # expert off (RL rollouts): replay the expert's plans without the expert
    noexp = AlfworldEnv(source="generated", cache_dir=cache, split_sizes={"train": 6 * n_per_type}, expert=False)
    s2, t2, r2 = _replay(noexp, tasks[:6], plans[:6])
    unfast = AlfworldEnv(source="generated", cache_dir=cache, split_sizes={"train": 6 * n_per_type}, expert=False,
                         fast=False)
    from interq.envs.alfworld import speedup
    speedup.uninstall()
    s3, t3, _ = _replay(unfast, tasks[:2], plans[:2])
    speedup.install()
    return {"alfworld_steps_per_s": s2 / t2, "alfworld_expert_on_steps_per_s": steps / t_step,
            "alfworld_without_speedup_steps_per_s": s3 / t3,
            "alfworld_reset_s": t_reset / n, "alfworld_episodes": n, "alfworld_expert_success": wins / n}


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
    return {"scienceworld_steps_per_s": steps / t_step, "scienceworld_with_valid_actions_steps_per_s": s2 / t2,
            "scienceworld_start_s": start, "scienceworld_reset_s": t_reset / n, "scienceworld_episodes": n,
            "scienceworld_gold_success": wins / n}


# ------------------------------------------------------------------ episodes per second: EnvPool against in-process


def _random_admissible(task_id, step, obs):
    """The fixed random-admissible policy: a choice among the sorted admissible actions seeded by (task, step)."""
    adm = sorted(obs.admissible_actions or ())
    return random.Random(f"{task_id}|{step}").choice(adm) if adm else "look"


def _proc_stat(pid) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()  # fields from the state on
    except OSError:
        return None


def _cpu_s() -> dict:
    """CPU seconds of this process (all its threads, key ``"self"``) and of each live descendant (the pool's workers
    and the engines' own processes, e.g. ScienceWorld's JVMs; key: pid), read from /proc: call it before they are
    closed. :func:`_cpu_since` turns two readings into the CPU spent in between."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    out: dict = {"self": me.ru_utime + me.ru_stime}
    stats = {int(d.name): st for d in Path("/proc").iterdir() if d.name.isdigit() and (st := _proc_stat(d.name))}
    children: dict[int, list[int]] = {}
    for pid, st in stats.items():
        children.setdefault(int(st[1]), []).append(pid)  # field 4: ppid
    todo = list(children.get(os.getpid(), []))
    while todo:
        pid = todo.pop()
        out[pid] = (int(stats[pid][11]) + int(stats[pid][12])) / os.sysconf("SC_CLK_TCK")  # utime + stime
        todo += children.get(pid, [])
    return out


def _cpu_since(start: dict) -> float:
    """CPU seconds spent since the reading ``start`` by this process and the descendants alive now (a process that
    ended in between, e.g. a closed environment's JVM still shutting down at ``start``, counts nothing)."""
    now = _cpu_s()
    return sum(v - start.get(k, 0.0) for k, v in now.items())


def _play_in_process(env, tasks, policy):
    """Play every task to its end in this process; returns (seconds, [(steps, won) per episode])."""
    out = []
    t0 = time.perf_counter()
    for t in tasks:
        obs, steps, won = env.reset(t), 0, False
        while True:
            a = env.expert_action() if policy == "expert" else _random_admissible(t.task_id, steps, obs)
            if a is None:
                break
            r = env.step(a)
            steps, obs = steps + 1, r.observation
            if r.terminated or r.truncated:
                won = bool(r.info.get("won"))
                break
        out.append((steps, won))
    return time.perf_counter() - t0, out


def _play_pool(pool, tasks, policy):
    """The same episodes through a pool, in waves of ``num_envs`` (reset_batch, then lockstep steps);
    returns (seconds, [(steps, won)], failed episodes)."""
    w, out, failed = pool.num_envs, [], 0
    t0 = time.perf_counter()
    for lo in range(0, len(tasks), w):
        batch = tasks[lo:lo + w]
        obs = pool.reset_batch(batch)
        steps, won = [0] * w, [False] * w
        done = [i >= len(batch) for i in range(w)]
        while not all(done):
            experts = pool.expert_actions() if policy == "expert" else None
            acts = []
            for i in range(w):
                a = None
                if not done[i]:
                    a = experts[i] if experts is not None else _random_admissible(batch[i].task_id, steps[i], obs[i])
                    done[i] = a is None
                acts.append(a)
            if all(a is None for a in acts):
                break
            for i, r in enumerate(pool.step_batch(acts)):
                if r is None:
                    continue
                steps[i], obs[i] = steps[i] + 1, r.observation
                if r.terminated or r.truncated:
                    done[i], won[i] = True, bool(r.info.get("won"))
                    failed += "failure" in r.info
        out += list(zip(steps, won))[:len(batch)]
    return time.perf_counter() - t0, out, failed


def bench_pool(name, env_kwargs, n_tasks, policy, workers, warm=None, warmup_passes=1):
    """Episodes per second in-process and through EnvPool with each worker count; see the module docstring.
    ``*_pool_cores_used`` counts this process and every live descendant (workers, ScienceWorld's JVMs)."""
    from interq.envs import make_env
    from interq.envs.pool import EnvPool

    t0, c0 = time.perf_counter(), _cpu_s()
    env = make_env(name, **env_kwargs)
    tasks = env.tasks("train")[:n_tasks]
    if warm is not None:
        warm(env, tasks)
    env.reset(tasks[0])  # untimed first reset (caches, JIT), as each pool worker gets below
    for _ in range(warmup_passes):  # untimed: a long-lived engine is warm (JIT-compiled, caches filled)
        _play_in_process(env, tasks, policy)
    dt, ref = _play_in_process(env, tasks, policy)
    # CPU cores used over the env's whole life (its own processes included), as for the pools below
    cores = {"in_process": _cpu_since(c0) / (time.perf_counter() - t0)}
    env.close()
    eps = {"in_process": len(tasks) / dt}
    start, same, failed = {}, True, 0
    for w in workers:
        t0, c0 = time.perf_counter(), _cpu_s()
        pool = EnvPool.from_name(name, num_envs=w, step_timeout_s=600.0, **env_kwargs)
        try:
            start[str(w)] = time.perf_counter() - t0
            pool.reset_batch(tasks[:w])  # untimed first reset of every worker
            for _ in range(warmup_passes * w):  # each worker's engine warms on as many episodes as in-process's
                _play_pool(pool, tasks, policy)
            dt, got, f = _play_pool(pool, tasks, policy)
            # CPU of this process, the workers and their engines over the pool's whole life, start-up included (no
            # worker was replaced: a replaced worker's CPU would be missing)
            cores[str(w)] = _cpu_since(c0) / (time.perf_counter() - t0)
        finally:
            pool.close()
        eps[str(w)] = len(tasks) / dt
        same &= got == ref
        failed += f
        print(f"[pool] {name}: {w} worker(s) {eps[str(w)]:.3f} episodes/s (in-process {eps['in_process']:.3f})",
              file=sys.stderr, flush=True)
    best = max((k for k in eps if k != "in_process"), key=lambda k: eps[k])
    return {f"{name}_pool_episodes_per_s": eps, f"{name}_pool_speedup": eps[best] / eps["in_process"],
            f"{name}_pool_best_workers": int(best), f"{name}_pool_start_s": start,
            f"{name}_pool_cores_used": cores,
            f"{name}_pool_episodes": len(tasks), f"{name}_pool_steps": sum(s for s, _ in ref),
            f"{name}_pool_policy": policy, f"{name}_pool_same_outcomes": same, f"{name}_pool_failed_episodes": failed}


def bench_pools(n_tasks, n_steps, workers, cache, warmup_passes=1):
    out = {}
    try:
        import alfworld  # noqa: F401
    except ImportError as e:
        out["alfworld_pool_note"] = f"alfworld extra missing: {e}"
    else:
        def write_games(env, tasks):  # the generated games are written once, before any timing
            for t in tasks:
                env.game_file(t)

        out.update(bench_pool("alfworld", {"source": "generated", "cache_dir": cache, "split_sizes": {"train": n_tasks},
                                           "expert": False, "max_steps": n_steps}, n_tasks, "random", workers, write_games,
                              warmup_passes))
    try:
        import scienceworld  # noqa: F401
    except ImportError as e:
        out["scienceworld_pool_note"] = f"scienceworld extra missing: {e}"
    else:
        names = ["find-living-thing", "find-non-living-thing", "boil", "melt"]
        out.update(bench_pool("scienceworld", {"task_names": names, "max_variations": -(-n_tasks // len(names))},
                              n_tasks, "expert", workers, warmup_passes=warmup_passes))
    out["pool_warmup_passes"] = warmup_passes
    return out


# ------------------------------------------------------------------ one policy on two engines


def bench_cross_engine(policy_dir, n_tasks, cache):
    if not (Path(policy_dir) / "config.json").is_file():
        return {"cross_engine_success_diff": None,
                "cross_engine_note": f"no policy at {policy_dir} (make one with `interq demo` or pass --policy)"}
    try:
        import alfworld  # noqa: F401
    except ImportError as e:
        return {"cross_engine_success_diff": None, "cross_engine_note": f"alfworld extra missing: {e}"}
    path = Path(__file__).resolve().parents[1] / "scripts" / "cross_engine_eval.py"
    spec = importlib.util.spec_from_file_location("cross_engine_eval", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    rep = mod.cross_engine_eval(policy_dir, n_tasks, cache_dir=Path(cache) / "cross_engine")
    print(f"[cross-engine] {mod.summary(rep)}", file=sys.stderr, flush=True)
    return {"cross_engine_success_diff": rep.success_diff, "cross_engine_diff_ci95": rep.diff_ci95,
            "cross_engine_tasks": rep.tasks, "cross_engine_policy": str(policy_dir),
            "cross_engine_household_success": rep.household_success, "cross_engine_alfworld_success": rep.alfworld_success,
            "cross_engine_outcome_agree": rep.outcome_agree, "cross_engine_trajectory_agree": rep.trajectory_agree,
            "cross_engine_s": rep.household_seconds + rep.alfworld_seconds}


def bench_overlap(policy_dir, episodes, latencies_ms, repeats):
    """``env.overlap`` on and off, a household policy rolled out through ``interq.train.rl.rollout`` (as the trainer
    does) with ``episodes`` EnvPool workers whose environments take ``latency`` ms a step (``LatencyEnv``: the
    latency of a slow engine without its CPU). Wall seconds per rollout (median of ``repeats``, on and off
    interleaved), the share of it spent waiting for environments, and whether both played the same episodes."""
    if not (Path(policy_dir) / "config.json").is_file():
        return {"overlap_speedup": None, "overlap_note": f"no policy at {policy_dir} (pass --overlap-policy)"}
    import functools
    import statistics

    from interq.agent.loop import PooledEnvs
    from interq.envs.pool import EnvPool, LatencyEnv
    from interq.rollout import RolloutEngine
    from interq.train import rl
    from interq.train.build import build_executor, chat_format, env_factory, split_tasks
    from interq.train.config import build_config
    from interq.train.experiments import SETTINGS
    from interq.train.policy import load_policy

    base = SETTINGS["study"] + [f"env.num_workers={episodes}"]
    cfg_off, cfg_on = (build_config("bf16", base + [f"env.overlap={x}"]) for x in ("false", "true"))
    model, tok = load_policy(policy_dir)
    fmt = chat_format(tok)
    ex = build_executor(model, cfg_off.rollout)
    engine = RolloutEngine(ex.module, cache_factory=ex.cache_factory, pad_token_id=fmt.pad_token_id)
    make_env = env_factory(cfg_off.env)
    tasks = split_tasks(make_env, cfg_off.env)[0][:episodes]
    seeds, groups = [7000 + i for i in range(len(tasks))], list(range(len(tasks)))
    rows, out = [], {}
    for latency in latencies_ms:
        env_fn = functools.partial(LatencyEnv, make_env, step_latency_s=latency / 1000)
        with EnvPool(env_fn, len(tasks)) as pool:
            envs = PooledEnvs(pool)
            wall, waited, played = {"off": [], "on": []}, {"off": [], "on": []}, {}
            for _ in range(repeats):
                for mode, cfg in (("off", cfg_off), ("on", cfg_on)):
                    env0, t0 = envs.seconds, time.perf_counter()
                    eps = rl.rollout(engine, fmt, make_env, tasks, seeds, groups, rl.sampling_params(cfg, fmt), cfg, envs)
                    wall[mode].append(time.perf_counter() - t0)
                    waited[mode].append(envs.seconds - env0)
                    played[mode] = [(ep.actions, ep.rewards, ep.won) for ep in eps]
        off, on = statistics.median(wall["off"]), statistics.median(wall["on"])
        turns = sum(len(a) for a, _, _ in played["off"])
        row = {"latency_ms": latency, "off_s": round(off, 3), "on_s": round(on, 3), "speedup": round(off / on, 3),
               "env_wait_share_off": round(statistics.median(waited["off"]) / off, 3),
               "env_wait_share_on": round(statistics.median(waited["on"]) / on, 3),
               "same_episodes": played["off"] == played["on"], "turns": turns}
        rows.append(row)
        print(f"[overlap] {row}", file=sys.stderr, flush=True)
    print("\n| env step latency (ms) | rollout, overlap off (s) | on (s) | speed-up | waiting for envs, off / on | "
          "same episodes |\n|---|---|---|---|---|---|", file=sys.stderr)
    for r in rows:
        print(f"| {r['latency_ms']} | {r['off_s']:.2f} | {r['on_s']:.2f} | {r['speedup']:.2f}x | "
              f"{r['env_wait_share_off']:.0%} / {r['env_wait_share_on']:.0%} | {r['same_episodes']} |", file=sys.stderr)
    out["overlap"] = rows
    out["overlap_speedup"] = max(r["speedup"] for r in rows)
    out["overlap_same_episodes"] = all(r["same_episodes"] for r in rows)
    out["overlap_policy"], out["overlap_episodes"] = str(policy_dir), len(tasks)
    return out


SECTIONS = ("household", "alfworld", "scienceworld", "pools", "fidelity", "cross_engine", "overlap")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fidelity-per-type", type=int, default=5)
    ap.add_argument("--alfworld-per-type", type=int, default=1)
    ap.add_argument("--household-tasks", type=int, default=300)
    ap.add_argument("--pool-episodes", type=int, default=8, help="episodes per configuration (ALFWorld, ScienceWorld)")
    ap.add_argument("--pool-warmup-passes", type=int, default=1, help="untimed passes over the episodes before the "
                    "timed one, per configuration (0: one untimed reset only, the measurement before 2026-12-01 23:30)")
    ap.add_argument("--pool-steps", type=int, default=10, help="steps of each ALFWorld episode (random-admissible policy)")
    ap.add_argument("--workers", default="1,2,4", help="EnvPool worker counts, comma-separated")
    ap.add_argument("--policy", default="runs/study/warm_start", help="household policy of the cross-engine check")
    ap.add_argument("--cross-engine-tasks", type=int, default=16)
    ap.add_argument("--overlap-policy", default="results/study-text/warm_start",
                    help="household policy (text actions) of the overlap section")
    ap.add_argument("--overlap-episodes", type=int, default=8, help="episodes (= workers) of the overlap section")
    ap.add_argument("--overlap-latency-ms", default="0,25,100", help="environment step latencies, comma-separated")
    ap.add_argument("--overlap-repeats", type=int, default=3)
    ap.add_argument("--sections", default=",".join(SECTIONS), help=f"what to run, comma-separated: {','.join(SECTIONS)}")
    ap.add_argument("--quick", action="store_true", help="small sizes (smoke run)")
    args = ap.parse_args()
    sections = [x.strip() for x in args.sections.split(",") if x.strip()]
    if not sections or set(sections) - set(SECTIONS):
        ap.error(f"--sections: unknown {sorted(set(sections) - set(SECTIONS)) or sections!r}; accepted: {','.join(SECTIONS)}")
    try:
        workers = [int(w) for w in args.workers.split(",")]
        if not workers or min(workers) < 1:
            raise ValueError
    except ValueError:
        ap.error(f"--workers must be positive ints separated by commas (e.g. 1,2,4); got {args.workers!r}")
    if args.quick:
        args.fidelity_per_type, args.alfworld_per_type, args.household_tasks = 1, 1, 30
        args.pool_episodes, args.pool_steps, args.cross_engine_tasks = 4, 3, 4
        args.overlap_episodes, args.overlap_latency_ms, args.overlap_repeats = 4, "0,50", 1
    machine = machine_info()  # at the start; load_avg_end added at the end
    print(f"machine: {describe(machine)}", file=sys.stderr, flush=True)
    out: dict = {}
    t_all = time.perf_counter()

    def stage(prefix, result):
        out.update(result)
        print(json.dumps({k: v for k, v in result.items() if k.startswith(prefix)}), file=sys.stderr, flush=True)

    if "household" in sections:
        stage("household", bench_household(args.household_tasks))
    with tempfile.TemporaryDirectory(prefix="interq-bench-envs-") as cache:
        if "alfworld" in sections:
            stage("alfworld", bench_alfworld(args.alfworld_per_type, cache))
        if "scienceworld" in sections:
            stage("science", bench_scienceworld(["find-living-thing", "boil", "melt"], 2))
        if "pools" in sections:
            stage("", bench_pools(args.pool_episodes, args.pool_steps, workers, cache, args.pool_warmup_passes))
        if "fidelity" in sections:
            try:
                from interq.envs.alfworld.fidelity import run_fidelity
                rep = run_fidelity(args.fidelity_per_type, cache_dir=cache, progress=False)
                out.update({"fidelity_tasks": rep.tasks, "fidelity_success_agree": rep.success_agree,
                            "fidelity_outcome_agree": rep.outcome_agree, "fidelity_admissible_agree": rep.admissible_agree,
                            "fidelity_text_agree": rep.text_agree, "fidelity_per_type": rep.per_type,
                            "fidelity_disagreements": rep.disagreements[:5], "fidelity_s": rep.seconds})
            except ImportError as e:
                out.update({"fidelity_success_agree": None, "fidelity_admissible_agree": None,
                            "fidelity_note": f"alfworld extra missing: {e}"})
        if "cross_engine" in sections:
            stage("cross_engine", bench_cross_engine(args.policy, args.cross_engine_tasks, cache))
        if "overlap" in sections:
            latencies = [float(x) for x in args.overlap_latency_ms.split(",") if x.strip()]
            stage("overlap_", bench_overlap(args.overlap_policy, args.overlap_episodes, latencies, args.overlap_repeats))
    out["sections"] = sections
    out["total_s"] = time.perf_counter() - t_all
    out["machine"] = {**machine, "load_avg_end": load_avg()}
    print("RESULT " + json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
