"""Set-ups the trainer's tests share (tests/test_train_loop.py, tests/test_train_envs.py, tests/test_train_kill.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from interq.train.config import RunConfig, build_config


def warm_start(tmp_path_factory, preset: str, overrides: list[str]) -> Path:
    """A warm-started tiny policy of ``preset`` with ``overrides`` (for a module-scoped fixture)."""
    from interq.train.pipeline import prepare_policy

    path, _ = prepare_policy(build_config(preset, overrides), tmp_path_factory.mktemp("policy") / "p",
                             log=lambda *_: None)
    return path


def rollout_episodes(policy_dir: Path, cfg: RunConfig, pick: Callable[[list], tuple[list, list, list]], envs=None):
    """Roll out, as the trainer does, the episodes ``pick(train_tasks) -> (tasks, seeds, groups)`` names: the policy
    of ``policy_dir`` loaded, ``cfg``'s executor and environment (``envs``: where they run, None in this process).
    Returns ``(model, executor, chat format, episodes)``."""
    from interq.rollout import RolloutEngine
    from interq.train import rl
    from interq.train.build import build_executor, chat_format, env_factory, split_tasks
    from interq.train.policy import load_policy

    model, tok = load_policy(policy_dir)
    fmt = chat_format(tok)
    ex = build_executor(model, cfg.rollout)
    make_env = env_factory(cfg.env)
    train_tasks, _ = split_tasks(make_env, cfg.env)
    engine = RolloutEngine(ex.module, cache_factory=ex.cache_factory, pad_token_id=fmt.pad_token_id)
    tasks, seeds, groups = pick(train_tasks)
    episodes = rl.rollout(engine, fmt, make_env, tasks, seeds, groups, rl.sampling_params(cfg, fmt), cfg, envs)
    return model, ex, fmt, episodes


def without_timings(record: dict) -> dict:
    """A step record without what depends on the machine's speed (``time/*``, ``sync/seconds``): what a resumed run
    must reproduce exactly."""
    return {k: v for k, v in record.items() if not k.startswith("time/") and k != "sync/seconds"}
