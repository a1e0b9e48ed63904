"""Expert demonstrations as JSONL, with optional noise, and a reader.

Works with any environment that implements the protocol plus ``expert_action() -> str | None``
(household, generated ALFWorld games, ScienceWorld gold paths, synthshop): the recorder only calls
``reset``, ``step`` and ``expert_action``.

Noise: at each step, with probability ``noise``, the recorder takes a random admissible action
other than the expert's (marked ``noisy``), so a policy trained on the demos is imperfect on
purpose. The expert replans from the state it finds, so episodes usually still succeed, just
longer; environments without an admissible-action list get no noise.

One JSON object per line::

    {"env": "household", "task_id": "train-00042", "split": "train", "task_type": "pick_and_place",
     "task": "put a apple in fridge.",
     "observations": [o_0, o_1, ..., o_T],            # o_0 from reset, o_t after action t
     "admissible_actions": [[...], ..., [...]],        # per observation (null where the env has none)
     "actions": [a_1, ..., a_T], "expert_actions": [...], "noisy": [false, true, ...],
     "rewards": [r_1, ..., r_T],
     "outcome": {"won": true, "terminated": true, "truncated": false, "return": 10.0, "length": T},
     "noise": 0.1, "seed": 0}
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .base import Env, TaskSpec
from .prompting import build_prompt, format_action


@dataclass(frozen=True)
class Demo:
    env: str
    task_id: str
    split: str
    task_type: str | None
    task: str
    observations: tuple[str, ...]
    admissible_actions: tuple[tuple[str, ...] | None, ...]
    actions: tuple[str, ...]
    expert_actions: tuple[str | None, ...]
    noisy: tuple[bool, ...]
    rewards: tuple[float, ...]
    won: bool
    terminated: bool
    truncated: bool
    noise: float = 0.0
    seed: int = 0

    @property
    def length(self) -> int:
        return len(self.actions)

    @property
    def episode_return(self) -> float:
        return float(sum(self.rewards))

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        for k in ("won", "terminated", "truncated"):
            d.pop(k)
        d["outcome"] = {"won": self.won, "terminated": self.terminated, "truncated": self.truncated,
                        "return": self.episode_return, "length": self.length}
        return d

    @staticmethod
    def from_json(d: dict[str, Any]) -> "Demo":
        try:
            out = d["outcome"]
            return Demo(
                env=d["env"], task_id=d["task_id"], split=d["split"], task_type=d.get("task_type"), task=d["task"],
                observations=tuple(d["observations"]),
                admissible_actions=tuple(None if a is None else tuple(a) for a in d["admissible_actions"]),
                actions=tuple(d["actions"]), expert_actions=tuple(d["expert_actions"]), noisy=tuple(d["noisy"]),
                rewards=tuple(float(r) for r in d["rewards"]), won=bool(out["won"]),
                terminated=bool(out["terminated"]), truncated=bool(out["truncated"]),
                noise=float(d.get("noise", 0.0)), seed=int(d.get("seed", 0)),
            )
        except (KeyError, TypeError) as e:
            raise ValueError(f"not a demo record (missing or bad field: {e})") from None


def record_demo(env: Env, task: TaskSpec, noise: float = 0.0, rng: random.Random | None = None,
                seed: int = 0, max_steps: int | None = None) -> Demo:
    """Play one episode with the env's expert (plus noise) and return it."""
    if not 0.0 <= noise <= 1.0:
        raise ValueError(f"noise must be in [0, 1]; got {noise!r}")
    expert = getattr(env, "expert_action", None)
    if not callable(expert):
        raise TypeError(f"env {getattr(env, 'name', env)!r} has no expert_action(); demos need one")
    rng = rng or random.Random(seed)
    obs = env.reset(task)
    observations = [obs.text]
    admissible = [obs.admissible_actions]
    actions: list[str] = []
    experts: list[str | None] = []
    noisy: list[bool] = []
    rewards: list[float] = []
    won = terminated = truncated = False
    while max_steps is None or len(actions) < max_steps:
        e = expert()
        choices = [a for a in (obs.admissible_actions or ()) if a != e]
        if noise > 0 and choices and rng.random() < noise:
            action, is_noisy = rng.choice(choices), True
        elif e is None:
            break  # the expert has nothing to do (e.g. a gold path ran out)
        else:
            action, is_noisy = e, False
        r = env.step(action)
        obs = r.observation
        actions.append(action)
        experts.append(e)
        noisy.append(is_noisy)
        rewards.append(float(r.reward))
        observations.append(obs.text)
        admissible.append(obs.admissible_actions)
        won = bool(r.info.get("won", False))
        terminated, truncated = r.terminated, r.truncated
        if terminated or truncated:
            break
    return Demo(env=task.env, task_id=task.task_id, split=task.split, task_type=task.task_type, task=task.description,
                observations=tuple(observations), admissible_actions=tuple(admissible), actions=tuple(actions),
                expert_actions=tuple(experts), noisy=tuple(noisy), rewards=tuple(rewards), won=won,
                terminated=terminated, truncated=truncated, noise=noise, seed=seed)


def generate_demos(env: Env, tasks: Iterable[TaskSpec], noise: float = 0.0, seed: int = 0,
                   max_steps: int | None = None) -> Iterator[Demo]:
    """Demos for ``tasks`` in order; the noise draws come from one ``random.Random(seed)``."""
    rng = random.Random(seed)
    for task in tasks:
        yield record_demo(env, task, noise=noise, rng=rng, seed=seed, max_steps=max_steps)


def write_demos(path: str | os.PathLike, demos: Iterable[Demo]) -> int:
    """Write demos as JSONL (atomically: a temp file renamed into place). Returns the count."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    n = 0
    with open(tmp, "w", encoding="utf-8") as f:
        for d in demos:
            f.write(json.dumps(d.to_json(), ensure_ascii=False) + "\n")
            n += 1
    os.replace(tmp, path)
    return n


def iter_demos(path: str | os.PathLike) -> Iterator[Demo]:
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield Demo.from_json(json.loads(line))
            except (json.JSONDecodeError, ValueError) as e:
                raise ValueError(f"{path}:{lineno}: {e}") from None


def read_demos(path: str | os.PathLike) -> list[Demo]:
    """All demos of a JSONL file; a bad line raises ValueError naming the file and line."""
    return list(iter_demos(path))


def sft_pairs(demo: Demo, history_length: int = 2, include_noisy: bool = True, think: bool = False,
              env_name: str | None = None) -> list[tuple[str, str]]:
    """(prompt, target) pairs for supervised warm start, one per step, in the prompting.py format.

    ``include_noisy=False`` keeps only the expert's steps as targets (noisy steps still appear in the
    history of later prompts, as they happened).
    """
    pairs = []
    history: list[tuple[str, str]] = []
    for t, action in enumerate(demo.actions):
        prompt = build_prompt(demo.task, demo.observations[t], demo.admissible_actions[t], history=history, step=t,
                              history_length=history_length, env_name=env_name or demo.env, think=think)
        if include_noisy or not demo.noisy[t]:
            pairs.append((prompt, format_action(action)))
        history.append((demo.observations[t], action))
    return pairs


def summarize(demos: Sequence[Demo]) -> dict[str, float]:
    n = len(demos)
    if n == 0:
        return {"episodes": 0, "success_rate": 0.0, "mean_length": 0.0, "noisy_frac": 0.0}
    steps = sum(d.length for d in demos)
    return {"episodes": n, "success_rate": sum(d.won for d in demos) / n, "mean_length": steps / n,
            "noisy_frac": sum(sum(d.noisy) for d in demos) / max(steps, 1)}


__all__ = ["Demo", "record_demo", "generate_demos", "write_demos", "read_demos", "iter_demos", "sft_pairs", "summarize"]
