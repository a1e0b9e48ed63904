"""``interq eval``: held-out success of a saved policy, measured by the trainer's own evaluation.

The policy directory (a warm start, a checkpoint, or a run directory's newest checkpoint) is loaded, the executor of
``rollout.*`` is built from it (or the one ``--executor`` names), and :func:`interq.train.rl.evaluate` plays the
held-out tasks of ``env.*`` exactly as a training run's evaluations do: the first ``env.num_eval_tasks`` tasks of
``env.eval_split``, ``train.eval_episodes_per_task`` episodes each, at ``train.eval_temperature``, with the same
fixed episode seeds. So a checkpoint's ``interq eval`` under its run's config reproduces that run's ``eval/*``
numbers at that step (same executor, same machine class).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from interq.train.config import ConfigError, RunConfig, replace

# settings that fix how the agent reads and answers: a policy evaluated under other ones is rarely meant
AGENT_FIELDS = (("env", "action_format"), ("env", "prompt"), ("env", "show_admissible"), ("algo", "layout"),
                ("rollout", "history_turns"))


def policy_directory(path: str | Path) -> Path | str:
    """The directory to load: ``path`` itself when it holds a policy (``config.json``), a run directory's newest
    checkpoint, or ``smollm2``; :class:`ConfigError` naming ``--policy`` otherwise."""
    if str(path) == "smollm2":
        return "smollm2"
    p = Path(path)
    if (p / "config.json").is_file():
        return p
    steps = sorted(d for d in (p / "checkpoints").glob("step_*") if (d / "config.json").is_file())
    if steps:
        return steps[-1]
    raise ConfigError(f"--policy={str(path)!r}: not a policy directory (no config.json there, nor a checkpoints/step_* "
                      "with one); give a warm start, a checkpoint or a run directory")


def agent_differences(policy: Path | str, cfg: RunConfig) -> list[str]:
    """The agent-facing settings (:data:`AGENT_FIELDS`) in which ``cfg`` differs from the config the policy was
    saved with (``run_config.yaml`` beside it; none when it has none), as ``env.action_format: index -> text``."""
    stored = Path(policy) / "run_config.yaml" if not isinstance(policy, str) else None
    if stored is None or not stored.is_file():
        return []
    import yaml

    data = yaml.safe_load(stored.read_text()) or {}
    out = []
    for section, name in AGENT_FIELDS:
        was = (data.get(section) or {}).get(name)
        now = getattr(getattr(cfg, section), name)
        if was is not None and was != now:
            out.append(f"{section}.{name}: {was} -> {now}")
    return out


def evaluate_policy(policy: Path | str, cfg: RunConfig) -> dict:
    """Play ``cfg``'s held-out tasks with the policy at ``policy`` (its executor from ``cfg.rollout``), by
    :func:`interq.train.rl.evaluate`. Returns its ``eval/*`` metrics plus ``episodes``, ``tasks``, ``env_info``,
    ``executor`` and ``seconds``; :class:`ConfigError` when the held-out set is empty."""
    import torch

    from interq.machine import resolve_device
    from interq.rollout import RolloutEngine
    from interq.train import rl
    from interq.train.build import build_executor, chat_format, env_factory, env_runner, split_tasks
    from interq.train.pipeline import _quiet_transformers
    from interq.train.policy import load_policy

    t0 = time.perf_counter()
    make_env = env_factory(cfg.env)
    env_info: dict = {}
    _, tasks = split_tasks(make_env, cfg.env, env_info)
    if not tasks:
        raise ConfigError(f"env.eval_split={cfg.env.eval_split!r} of env.name={cfg.env.name!r}: no held-out task to "
                          f"play (env.num_eval_tasks={cfg.env.num_eval_tasks}, env.task_types={cfg.env.task_types!r})")
    _quiet_transformers()
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    model, tokenizer = load_policy(policy, cfg.model.dtype)
    model.to(resolve_device(cfg.train.device, "train.device"))
    fmt = chat_format(tokenizer)
    executor = build_executor(model, cfg.rollout)
    engine = RolloutEngine(executor.module, cache_factory=executor.cache_factory, pad_token_id=fmt.pad_token_id,
                           max_context_tokens=cfg.rollout.max_context_tokens, info=executor.info)
    envs = env_runner(cfg.env, make_env)
    try:
        metrics = rl.evaluate(engine, fmt, make_env, tasks, cfg, envs)
    finally:
        if getattr(envs, "pool", None) is not None:
            envs.pool.close()
    return {**metrics, "episodes": len(metrics["eval/outcomes"]), "tasks": len(tasks), "env_info": env_info,
            "executor": executor.info, "seconds": time.perf_counter() - t0}


def markdown_table(result: dict) -> str:
    """One row: the policy, environment, split, executor, episodes and the held-out metrics."""
    cols = ["policy", "env", "split", "executor", "episodes", "success", "return", "length", "invalid"]
    row = [result["policy"], result["env"], result["eval_split"], result["executor"], str(result["episodes"]),
           f"{result['success']:.3f}", f"{result['return']:.3f}", f"{result['length']:.2f}",
           f"{result['invalid_frac']:.3f}"]
    return f"| {' | '.join(cols)} |\n|{'---|' * len(cols)}\n| {' | '.join(row)} |\n"


def eval_command(args, command: str) -> int:
    """``interq eval`` after its arguments are parsed (``args``: preset, overrides, policy, episodes, executor, out,
    force): everything is checked before any work; prints the table and ends with ``RESULT {json}``."""
    from interq.train.build import check_env
    from interq.train.config import build_config, save_config

    if args.episodes is not None and args.episodes <= 0:
        raise ConfigError(f"--episodes={args.episodes} is not accepted; it must be > 0")
    policy = policy_directory(args.policy)
    episodes = [] if args.episodes is None else [f"env.num_eval_tasks={args.episodes}", "train.eval_episodes_per_task=1"]
    cfg = build_config(args.preset, [*args.overrides, *episodes])
    if args.executor != "arm":  # after validation: the arm's learner settings (algo.align) do not matter here
        cfg = replace(cfg, rollout=replace(cfg.rollout, executor=args.executor))
    check_env(cfg.env)
    for line in agent_differences(policy, cfg):
        print(f"[eval] note: the policy was saved with other agent settings, {line}", file=sys.stderr)
    out = Path(args.out or f"runs/eval/{cfg.name}")
    from interq import rundir

    rundir.enter(out, "eval", getattr(args, "force", False))  # checked and locked before any work (interq.rundir)
    r = evaluate_policy(policy, cfg)
    result = {"policy": str(policy), "env": cfg.env.name, "eval_split": cfg.env.eval_split,
              "executor": cfg.rollout.executor, "episodes": r["episodes"], "tasks": r["tasks"],
              "success": r["eval/success"], "return": r["eval/return"], "length": r["eval/length"],
              "invalid_frac": r["eval/invalid_frac"], "temperature": cfg.train.eval_temperature,
              "wall_s": round(r["seconds"], 1), "out": str(out)}
    out.mkdir(parents=True, exist_ok=True)
    save_config(cfg, out / "config.yaml")
    record = {**result, "command": command, "metrics": {k: v for k, v in r.items() if k.startswith("eval/")},
              "env_info": r["env_info"], "executor_info": r["executor"]}
    (out / "eval.json").write_text(json.dumps(record, indent=1, default=str) + "\n")
    print(markdown_table(result))
    print(f"held-out outcomes, config and metrics in {out / 'eval.json'}")
    print("RESULT " + json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in result.items()},
                                 sort_keys=True))
    return 0
