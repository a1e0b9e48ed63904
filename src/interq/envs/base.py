"""The one environment protocol every adapter implements (envs.md, "Shape every adapter shares").

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
