"""The one environment protocol every adapter implements (docs/environments.md).

gymnasium-style: ``reset(task) -> Observation`` and ``step(action) -> StepResult`` with termination
(the task ended: success or failure) kept apart from truncation (a step or context limit cut it).
``parse_action(generated_text) -> ParsedAction`` is pure and never raises.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class TaskSpec:
    env: str                       # environment name, e.g. "household", "alfworld", "scienceworld"
    task_id: str                   # stable identifier, unique within (env, split)
    split: str                     # "train", "valid_seen", "valid_unseen", "test", ...
    task_type: str | None = None   # e.g. ALFWorld's six types, ScienceWorld task name
    description: str = ""          # the goal as the agent reads it


@dataclass(frozen=True)
class Observation:
    text: str                                          # what the agent sees after this step
    admissible_actions: tuple[str, ...] | None = None  # None where the environment has no such list
    anchor: str = ""                                   # raw environment state text, for GiGPO anchor groups
    task: TaskSpec | None = None


@dataclass(frozen=True)
class StepResult:
    observation: Observation
    reward: float
    terminated: bool     # the episode ended by the task's own rules (won, or failed for good)
    truncated: bool      # cut by a limit (max steps, context), not by the task
    info: dict[str, Any] = field(default_factory=dict)  # at least "won": bool; "valid_action": bool


@dataclass(frozen=True)
class ParsedAction:
    action: str   # the action text to send to the environment
    valid: bool   # False when the generated text had no parseable action (costs the 0.1 penalty)


@runtime_checkable
class Env(Protocol):
    name: str

    def tasks(self, split: str) -> list[TaskSpec]: ...

    def reset(self, task: TaskSpec) -> Observation: ...

    def step(self, action: str) -> StepResult: ...

    def parse_action(self, generated_text: str) -> ParsedAction: ...

    def close(self) -> None: ...


ACTION_OPEN, ACTION_CLOSE = "<action>", "</action>"
MAX_PLAIN_ACTION_CHARS = 200


def extract_tagged_action(generated_text: object, lower: bool = True) -> ParsedAction:
    """Shared ``parse_action`` of the text environments (verl-agent convention). Never raises.

    - The action is the content of the LAST ``<action>...</action>`` pair (tags matched case-insensitively),
      stripped, blanks collapsed, lower-cased when ``lower``; ``valid`` is True iff it is non-empty.
    - Without a complete pair, plain text is tolerated: a single line of at most 200 characters without
      ``<``/``>`` (e.g. ``go to fridge 1``) is taken as the action with ``valid=True``; anything else gives
      its last non-empty line (cut to 200 characters) with ``valid=False`` (the 0.1 format penalty).
    - Not a string, or empty: ``ParsedAction("", False)``.
    Runs in linear time (a 100 KB string is fine).
    """
    if not isinstance(generated_text, str) or not generated_text.strip():
        return ParsedAction("", False)
    text = generated_text
    folded = text.lower()
    end = folded.rfind(ACTION_CLOSE)
    if end >= 0:
        start = folded.rfind(ACTION_OPEN, 0, end)
        if start >= 0:
            inner = text[start + len(ACTION_OPEN):end]
            action = " ".join(inner.split())
            if lower:
                action = action.lower()
            return ParsedAction(action, bool(action))
    lines = [ln for ln in text.splitlines() if ln.strip()]
    last = " ".join(lines[-1].split()) if lines else ""
    plain_ok = len(lines) == 1 and len(last) <= MAX_PLAIN_ACTION_CHARS and "<" not in last and ">" not in last
    action = last[:MAX_PLAIN_ACTION_CHARS]
    if lower:
        action = action.lower()
    return ParsedAction(action, plain_ok and bool(action))


class EpisodeError(RuntimeError):
    """A programming mistake in driving an environment: step() before reset() or after the episode ended."""


class UnknownTaskError(ValueError):
    """reset() was given a task this environment does not have (wrong env, split or id)."""


def resolve_split_sizes(defaults: dict[str, int], split_sizes: dict[str, int] | None) -> dict[str, int]:
    """``defaults`` updated by ``split_sizes``; an unknown split or a negative / non-int size is a ValueError."""
    sizes = dict(defaults)
    for k, v in (split_sizes or {}).items():
        if k not in defaults:
            raise ValueError(f"split_sizes: unknown split {k!r}; accepted: {list(defaults)}")
        if not isinstance(v, int) or v < 0:
            raise ValueError(f"split_sizes[{k!r}] must be a non-negative int; got {v!r}")
        sizes[k] = v
    return sizes


def describe_splits(env: Env, splits: tuple[str, ...] | list[str]) -> dict[str, dict]:
    """``split_sizes`` ({split: number of tasks}) and ``task_types`` ({split: {task type: number of tasks}}, types
    in order of first appearance) of ``env.tasks(split)`` for each split: the part of an env's ``info()`` that says
    what its splits hold."""
    sizes: dict[str, int] = {}
    types: dict[str, dict[str, int]] = {}
    for split in splits:
        tasks = env.tasks(split)
        sizes[split] = len(tasks)
        counts: dict[str, int] = {}
        for t in tasks:
            counts[str(t.task_type)] = counts.get(str(t.task_type), 0) + 1
        types[split] = counts
    return {"split_sizes": sizes, "task_types": types}
