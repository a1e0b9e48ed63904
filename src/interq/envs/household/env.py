"""``HouseholdEnv``: the built-in ALFWorld-style environment behind ``make_env("household")``.

Episode contract (verl-agent's ALFWorld conventions):

- ``reset(task)`` returns ALFWorld's intro without the TextWorld banner: "You are in the middle of a
  room. Looking quickly around you, you see ...\\n\\nYour task is to: put a clean apple in fridge."
- ``step(action)``: the action must equal an admissible command after stripping (TextWorld's rule;
  ``parse_action`` lower-cases and collapses blanks first). An inadmissible or unparseable action (also "" and a 100 KB
  string) answers "Nothing happens." with ``info["valid_action"] = False`` and costs a step.
- Reward ``success_reward`` (default 10.0) on the step that completes the goal, else 0.0.
  Success terminates (``terminated=True``); reaching ``max_steps`` (default 50) without success
  truncates (``truncated=True``, ``terminated=False``).
- ``info``: ``won``, ``valid_action``, ``step`` (1-based count), ``task_id``, ``task_type``.
- ``Observation.anchor`` is the raw engine text of the observation (GiGPO anchor states).
  ``Observation.admissible_actions`` is ALFWorld's list without ``help``.
- ``step`` before ``reset`` or after the episode ended raises :class:`EpisodeError` (a programming
  mistake, not an agent mistake). ``reset`` with a task this env does not have raises
  :class:`UnknownTaskError` naming what is accepted.
"""

from __future__ import annotations

import hashlib
import random
from typing import Iterable

from ..base import (EpisodeError, Observation, ParsedAction, StepResult, TaskSpec, UnknownTaskError, describe_splits,
                    extract_tagged_action, resolve_split_sizes)
from .engine import HouseholdGame
from .generator import DEFAULT_SPLIT_SIZES, SIZES, SPLITS, generate_goal, generate_world, parse_task_id
from .world import HouseholdWorld


class HouseholdEnv:
    """Pure-Python ALFWorld-style environment (see module docstring).

    Args:
        seed: selects the task set (same seed, same tasks on every machine).
        split_sizes: tasks per split (default ALFWorld's: 3553 / 140 / 134).
        max_steps: step limit (truncation).
        success_reward: reward on success (0 otherwise).
        worlds: play exactly these worlds instead of generated ones (``tasks(split)`` lists those with
            that split); used to replay exported or hand-written tasks.
        expert: "explore" (default; searches unchecked receptacles, consistent with what the agent
            sees) or "omniscient" (knows where everything is; shortest plans).
        size: "full" (default, ALFRED-like rooms) or "small" (compact rooms: at most two receptacles
            per type, no optional furniture, 2-4 distractor types; shorter prompts and plans for
            CPU-scale training). Tasks are determined by (seed, size, split, index).
        shuffle_actions: list the admissible actions in a fixed pseudo-random order per (task, admissible set)
            instead of ALFWorld's sorted order. For policies that answer with an action's number
            (``env.action_format=index``): in sorted order the number itself predicts the kind of action ("take"
            and "move" entries sort last), a shortcut RL reinforces (docs/results.md, "Learning settings").
    """

    name = "household"

    def __init__(self, seed: int = 0, split_sizes: dict[str, int] | None = None, max_steps: int = 50,
                 success_reward: float = 10.0, worlds: Iterable[HouseholdWorld] | None = None,
                 expert: str = "explore", size: str = "full", shuffle_actions: bool = False):
        if size not in SIZES:
            raise ValueError(f"size must be one of {list(SIZES)}; got {size!r}")
        self.size = size
        if expert not in ("explore", "omniscient"):
            raise ValueError(f"expert must be 'explore' or 'omniscient'; got {expert!r}")
        self.expert = expert
        if not isinstance(shuffle_actions, bool):
            raise ValueError(f"shuffle_actions must be true or false; got {shuffle_actions!r}")
        self.shuffle_actions = shuffle_actions
        if not isinstance(max_steps, int) or max_steps < 1:
            raise ValueError(f"max_steps must be a positive int; got {max_steps!r}")
        sizes = resolve_split_sizes(DEFAULT_SPLIT_SIZES, split_sizes)
        self.seed = int(seed)
        self.split_sizes = sizes
        self.max_steps = max_steps
        self.success_reward = float(success_reward)
        self._fixed: dict[str, HouseholdWorld] | None = None
        if worlds is not None:
            self._fixed = {}
            for w in worlds:
                if w.task_id in self._fixed:
                    raise ValueError(f"worlds: duplicate task_id {w.task_id!r}")
                self._fixed[w.task_id] = w
        self._cache: dict[str, HouseholdWorld] = {}
        self._task_lists: dict[str, list[TaskSpec]] = {}
        self._game: HouseholdGame | None = None
        self._task: TaskSpec | None = None
        self._steps = 0
        self._done = False

    def info(self) -> dict:
        """What this env plays, for the run's records (``env_info.json``; the warm start's ``policy_summary.json``):
        the engine, where the tasks come from, each split's size and task types, and the episode settings. Lists the
        tasks of every split (goals only, about 0.2 s for ALFWorld's 3,827); changes nothing an episode sees."""
        from interq import __version__

        out: dict = {"env": self.name, "engine": "household: interq's built-in ALFWorld-style engine (pure Python)",
                     "version": f"interq {__version__}"}
        if self._fixed is not None:
            splits = list(dict.fromkeys(w.split for w in self._fixed.values()))
            out["source"] = "worlds"  # exactly the worlds given (exported or hand-written tasks)
        else:
            splits = list(SPLITS)
            out.update(source="generated", seed=self.seed, size=self.size,
                       scenes="ALFRED's FloorPlan split: train and valid_seen in seen scenes, valid_unseen in unseen ones")
        out.update(describe_splits(self, splits))
        out.update(expert=self.expert, shuffle_actions=self.shuffle_actions, max_steps=self.max_steps,
                   success_reward=self.success_reward)
        return out

    # ---- tasks ---------------------------------------------------------------------------------
    @staticmethod
    def spec_of(world: HouseholdWorld) -> TaskSpec:
        return TaskSpec(env="household", task_id=world.task_id, split=world.split, task_type=world.goal.task_type,
                        description=world.goal.text)

    def tasks(self, split: str) -> list[TaskSpec]:
        if self._fixed is not None:
            return [self.spec_of(w) for w in self._fixed.values() if w.split == split]
        if split not in SPLITS:
            raise ValueError(f"split must be one of {list(SPLITS)}; got {split!r}")
        if split not in self._task_lists:
            specs = []
            for i in range(self.split_sizes[split]):
                w = self._cache.get(f"{split}-{i:05d}")
                g = w.goal if w is not None else generate_goal(split, i, self.seed, size=self.size)
                specs.append(TaskSpec(env="household", task_id=f"{split}-{i:05d}", split=split, task_type=g.task_type,
                                      description=g.text))
            self._task_lists[split] = specs
        return list(self._task_lists[split])

    def _world_for(self, split: str, index: int) -> HouseholdWorld:
        key = f"{split}-{index:05d}"
        w = self._cache.get(key)
        if w is None:
            w = generate_world(split, index, self.seed, size=self.size)
            self._cache[key] = w
        return w

    def world(self, task: TaskSpec | str) -> HouseholdWorld:
        """The full world (plain data) of a task of this env."""
        task_id = task.task_id if isinstance(task, TaskSpec) else task
        if isinstance(task, TaskSpec) and task.env != self.name:
            raise UnknownTaskError(f"task {task.task_id!r} belongs to env {task.env!r}, not 'household'")
        if self._fixed is not None:
            if task_id not in self._fixed:
                raise UnknownTaskError(f"unknown household task_id {task_id!r}; this env has "
                                       f"{len(self._fixed)} fixed worlds, e.g. {list(self._fixed)[:3]}")
            return self._fixed[task_id]
        try:
            split, index = parse_task_id(task_id)
        except ValueError as e:
            raise UnknownTaskError(str(e)) from None
        if index >= self.split_sizes[split]:
            raise UnknownTaskError(f"unknown household task {task_id!r}: split {split!r} has "
                                   f"{self.split_sizes[split]} tasks (indices 0-{self.split_sizes[split] - 1})")
        if isinstance(task, TaskSpec) and task.split != split:
            raise UnknownTaskError(f"task {task_id!r} is in split {split!r}, but the TaskSpec says {task.split!r}")
        return self._world_for(split, index)

    # ---- episode -------------------------------------------------------------------------------
    def reset(self, task: TaskSpec | str) -> Observation:
        world = self.world(task)
        self._task = self.spec_of(world)
        self._game = HouseholdGame(world)
        self._steps = 0
        self._done = False
        text = self._game.intro(banner=False)
        return Observation(text=text, admissible_actions=self.admissible_actions(), anchor=text, task=self._task)

    def admissible_actions(self) -> tuple[str, ...]:
        if self._game is None:
            raise EpisodeError("no episode: call reset(task) first")
        commands = tuple(c for c in self._game.admissible_commands() if c != "help")
        if not self.shuffle_actions:
            return commands
        # one fixed permutation per (task set, task, admissible set): the same state always lists its actions in the
        # same order (GiGPO's anchor groups, replays), but an action's position says nothing about what it is
        key = "\x1f".join((str(self.seed), self._task.task_id, *commands))
        rng = random.Random(int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little"))
        order = list(commands)
        rng.shuffle(order)
        return tuple(order)

    def step(self, action: str) -> StepResult:
        if self._game is None:
            raise EpisodeError("step() before reset(): call reset(task) first")
        if self._done:
            raise EpisodeError(f"episode of task {self._task.task_id!r} has ended; call reset(task) before step()")
        if not isinstance(action, str):
            raise TypeError(f"action must be a str (use parse_action on generated text); got {type(action).__name__}")
        feedback, valid = self._game.step(action)
        self._steps += 1
        won = valid and self._game.won()
        terminated = won
        truncated = (not won) and self._steps >= self.max_steps
        self._done = terminated or truncated
        obs = Observation(text=feedback, admissible_actions=self.admissible_actions(), anchor=feedback, task=self._task)
        info = {"won": won, "valid_action": valid, "step": self._steps, "task_id": self._task.task_id,
                "task_type": self._task.task_type}
        return StepResult(obs, self.success_reward if won else 0.0, terminated, truncated, info)

    def parse_action(self, generated_text: str) -> ParsedAction:
        return extract_tagged_action(generated_text, lower=True)

    def expert_action(self) -> str | None:
        """The expert's next action from the current state; None when the episode is over or won."""
        if self._game is None or self._done:
            return None
        return self._game.expert_action(explore=self.expert == "explore")

    @property
    def game(self) -> HouseholdGame | None:
        """The running game (state inspection for tests and the fidelity check)."""
        return self._game

    def close(self) -> None:
        self._game = None
