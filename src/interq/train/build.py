"""Builders: turn a validated RunConfig into plain components (environment factory, tasks, policy, chat
format, executor, demos). Components take plain arguments; only this module reads the config."""

from __future__ import annotations

import functools
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from interq.agent.loop import default_render, make_render
from interq.envs.base import TaskSpec
from interq.train.config import ConfigError, EnvConfig, RolloutConfig, RunConfig


# ---------------------------------------------------------------------------------------------- environments


_BUILT: set[str] = set()  # (env name, env_kwargs) already built once in this process by env_factory


def env_factory(cfg: EnvConfig) -> Callable[[], Any]:
    """A zero-argument callable returning a fresh environment."""
    kwargs = dict(cfg.env_kwargs)
    if cfg.name == "toy":
        from interq.agent.toy_env import ToyEnv

        kwargs.setdefault("max_steps", cfg.max_turns)
        try:
            ToyEnv(**kwargs)
        except (ValueError, TypeError) as e:
            raise ConfigError(f"env.name='toy' / env.env_kwargs={kwargs}: {e}") from e
        return functools.partial(ToyEnv, **kwargs)  # picklable: worker processes build it (env.num_workers)
    try:
        from interq.envs import make_env
    except ImportError as e:  # pragma: no cover - depends on the environments package
        raise ConfigError(f"env.name={cfg.name!r}: interq.envs.make_env is not available ({e}); accepted here: 'toy'") from e
    from interq._optional import MissingDependency
    from interq.envs import UnknownEnvError

    key = repr((cfg.name, sorted(kwargs.items())))
    try:
        if key not in _BUILT:  # one trial build per process (a ScienceWorld env is a JVM start)
            make_env(cfg.name, **kwargs).close()
            _BUILT.add(key)
    except UnknownEnvError as e:
        raise ConfigError(f"env.name={cfg.name!r}: {e}") from e
    except (KeyError, ValueError, TypeError, MissingDependency, FileNotFoundError) as e:
        raise ConfigError(f"env.name={cfg.name!r} / env.env_kwargs={kwargs}: {e}") from e
    return functools.partial(make_env, cfg.name, **kwargs)  # picklable: worker processes build it (env.num_workers)


def env_runner(cfg: EnvConfig, make_env: Callable[[], Any]):
    """Where the agent loop runs the environments (``interq.agent.loop``): in this process (``env.num_workers=0``)
    or an :class:`~interq.envs.pool.EnvPool` of ``env.num_workers`` worker processes, started here (the caller
    closes ``runner.pool``). ``make_env`` must be picklable for a pool (:func:`env_factory`'s is)."""
    from interq.agent.loop import InProcessEnvs, PooledEnvs

    if cfg.num_workers == 0:
        return InProcessEnvs(make_env)
    from interq.envs.pool import EnvPool

    pool = EnvPool(make_env, cfg.num_workers, step_timeout_s=cfg.step_timeout_s,
                   reset_timeout_s=max(cfg.step_timeout_s, 60.0))
    return PooledEnvs(pool)


def agent_render(cfg: RunConfig) -> Callable[..., str]:
    """The observation renderer of ``env.prompt``: the compact one (tiny policy) or verl-agent's prompt."""
    from interq.train.config import resolve_auto

    e = resolve_auto(cfg).env
    if e.prompt == "verl_agent":
        from interq.envs.prompting import make_prompt_render

        return make_prompt_render(e.name, e.show_admissible)
    return make_render(e.show_admissible, e.action_format == "index")


def demo_answer(cfg: RunConfig) -> Callable[[str], str] | None:
    """How an expert action is written as the policy's answer in the warm start: in ``<action>`` tags under
    verl-agent's prompt (the answer format it asks for), else as is (None)."""
    from interq.train.config import resolve_auto

    if resolve_auto(cfg).env.prompt == "verl_agent":
        from interq.envs.prompting import format_action

        return format_action
    return None


def split_tasks(make_env: Callable[[], Any], cfg: EnvConfig,
                env_info: dict | None = None) -> tuple[list[TaskSpec], list[TaskSpec]]:
    """(train tasks, held-out tasks) of ``cfg``. ``env_info``, if given, receives what the environment reports
    about itself (its ``info()``, e.g. ALFWorld's game source), for the run's records."""
    env = make_env()
    try:
        if env_info is not None and callable(getattr(env, "info", None)):
            env_info.update(env.info())
        try:
            train = list(env.tasks(cfg.train_split))
            evals = list(env.tasks(cfg.eval_split))
        except ValueError as e:  # an unknown split: the env names the accepted ones
            raise ConfigError(f"env.train_split={cfg.train_split!r} / env.eval_split={cfg.eval_split!r}: {e}") from e
    finally:
        env.close()
    if cfg.task_types:
        keep = {t.strip() for t in cfg.task_types.split(",") if t.strip()}
        known = {t.task_type for t in train + evals}
        if keep - known:
            raise ConfigError(f"env.task_types={cfg.task_types!r}: unknown {sorted(keep - known)}; accepted: {sorted(known)}")
        train = [t for t in train if t.task_type in keep]
        evals = [t for t in evals if t.task_type in keep]
    if cfg.num_train_tasks:
        train = train[: cfg.num_train_tasks]
    evals = evals[: cfg.num_eval_tasks]
    if not train:
        raise ConfigError(f"env.train_split={cfg.train_split!r} has no tasks")
    return train, evals


def check_env(cfg: EnvConfig) -> None:
    """Check ``env.name``, ``env.env_kwargs``, the splits and ``env.task_types`` against the environment itself
    (building it and listing its tasks), so that a bad value stops the command before any work with a
    :class:`ConfigError` naming the field."""
    split_tasks(env_factory(cfg), cfg)


# ---------------------------------------------------------------------------------------------- demos


@dataclass
class Demo:
    task: TaskSpec
    observations: list[str]   # rendered observation text per turn (what the agent saw)
    actions: list[str]        # action text per turn (its number in the admissible list with ``by_index``)
    won: bool
    stopped: str = ""         # why the episode was cut short before it ended ("": it ran to its end or max_turns)


def collect_demos(make_env: Callable[[], Any], tasks: list[TaskSpec], num_demos: int, noise: float, seed: int,
                  max_turns: int, layout: str = "concatenated", history_turns: int = 0,
                  render: Callable[..., str] = default_render, by_index: bool = False,
                  answer: Callable[[str], str] | None = None) -> list[Demo]:
    """Expert episodes with a share ``noise`` of random admissible actions, rendered like the agent loop.
    ``by_index``: the recorded answer is the action's number in the admissible list (``env.action_format``).
    ``answer``: how an action text is written as the answer (:func:`demo_answer`; default: as is).

    An episode stops (its earlier turns kept, ``Demo.stopped`` saying why) where the expert has no action (None:
    nothing is stepped) or, with ``by_index``, gives one that is not in the admissible list (it has no number to
    write); an episode stopped before its first turn is left out."""
    rng = random.Random(seed)
    demos = []
    env = make_env()
    try:
        for k in range(num_demos):
            task = tasks[k % len(tasks)]
            obs = env.reset(task)
            texts, actions, hist, won, stopped = [], [], [], False, ""
            for t in range(max_turns):
                window = history_turns if layout == "per_turn" else None
                adm = list(obs.admissible_actions or ())
                if adm and rng.random() < noise:
                    action = rng.choice(adm)
                else:
                    action = env.expert_action()
                if action is None:
                    stopped = f"turn {t}: the expert has no action"
                    break
                if by_index and action not in adm:
                    stopped = f"turn {t}: the expert's action {action!r} is not in the admissible list"
                    break
                texts.append(render(task, obs, t, hist, window))
                actions.append(str(adm.index(action) + 1) if by_index else answer(action) if answer else action)
                res = env.step(action)
                hist.append((obs.text, action))
                obs = res.observation
                won = won or bool(res.info.get("won"))
                if res.terminated or res.truncated:
                    break
            if actions:
                demos.append(Demo(task, texts, actions, won, stopped))
        if num_demos and not demos:
            raise RuntimeError(f"no expert demonstration could be recorded in {num_demos} episodes of "
                               f"{getattr(env, 'name', type(env).__name__)!r} (e.g. task {task.task_id!r}, {stopped})")
    finally:
        env.close()
    return demos


def demo_rows(demos: list[Demo], fmt, tokenizer, layout: str) -> list[tuple[list[int], list[bool]]]:
    """Render demos with the engine's chat format -> (token ids, action mask) rows."""
    stop = fmt.stop_token_ids[0]
    rows = []
    for d in demos:
        if layout == "concatenated":
            chat, ids, mask = fmt.start(), [], []
            for o, a in zip(d.observations, d.actions):
                obs = chat.observation(o)
                act = list(tokenizer(a, add_special_tokens=False)["input_ids"]) + [stop]
                chat.action(act)
                ids += obs + act
                mask += [False] * len(obs) + [True] * len(act)
            rows.append((ids, mask))
        else:
            for o, a in zip(d.observations, d.actions):
                obs = fmt.start().observation(o)
                act = list(tokenizer(a, add_special_tokens=False)["input_ids"]) + [stop]
                rows.append((obs + act, [False] * len(obs) + [True] * len(act)))
    return rows


def demo_texts(demos: list[Demo]) -> list[str]:
    return [t for d in demos for t in (*d.observations, *d.actions)]


# ---------------------------------------------------------------------------------------------- policy


def chat_format(tokenizer):
    from interq.rollout.chat import MINIMAL_SPECIAL_TOKENS, HFChatFormat, MinimalChatFormat

    if all(tokenizer.convert_tokens_to_ids(t) not in (None, tokenizer.unk_token_id) for t in MINIMAL_SPECIAL_TOKENS):
        return MinimalChatFormat(tokenizer)
    return HFChatFormat(tokenizer)


# ---------------------------------------------------------------------------------------------- executor


@dataclass
class Executor:
    """The behaviour policy: a module with the HF forward signature, its cache factory and weight sync."""

    module: torch.nn.Module
    cache_factory: Callable[[Any], Any] | None
    sync: Callable[[torch.nn.Module], float]   # learner -> seconds
    qcfg: Any                                  # interq.quant.QuantConfig for w8a8 (also the aligned forward)
    info: dict


def quant_config(cfg: RolloutConfig):
    from interq.quant import QuantConfig

    return QuantConfig(w_format=cfg.weight_format, kv_format=cfg.kv_format, w_bits=cfg.w_bits, a_bits=cfg.a_bits,
                       kv_bits=cfg.kv_bits)


def build_executor(learner: torch.nn.Module, cfg: RolloutConfig) -> Executor:
    import copy

    from interq.quant import BF16_EXECUTOR, make_executor, make_kv_cache, sync_weights
    from interq.rollout.fast_layers import set_rollout_attention

    if cfg.executor in ("bf16", "fp32"):
        # unquantized: make_executor's packed bf16 products and fused norms (the same bits as the learner's modules
        # in this dtype, fewer and faster calls), as bench_quant's bf16 executor
        dtype = torch.bfloat16 if cfg.executor == "bf16" else torch.float32
        module = set_rollout_attention(make_executor(copy.deepcopy(learner).to(dtype), BF16_EXECUTOR), cfg.attention)
        return Executor(module, None, lambda lr: sync_weights(lr, module), None, {"executor": cfg.executor})

    qcfg = quant_config(cfg)
    dtype = torch.bfloat16 if cfg.executor_dtype == "bfloat16" else torch.float32
    module = set_rollout_attention(make_executor(copy.deepcopy(learner).to(dtype), qcfg), cfg.attention)
    return Executor(module, lambda mc: make_kv_cache(qcfg, mc), lambda lr: sync_weights(lr, module), qcfg,
                    {"executor": "w8a8", "dtype": cfg.executor_dtype,
                     "quant": {"w_format": qcfg.w_format, "kv_format": qcfg.kv_format}})


def policy_source_dir(cfg: RunConfig) -> Path | None:
    return None if cfg.model.source == "tiny" else Path(cfg.model.source)
