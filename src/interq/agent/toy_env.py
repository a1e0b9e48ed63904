"""``toy``: a tiny multi-turn environment for fast tests of the training loop (not a benchmark).

Each task is a secret sequence of ``length`` words drawn from a small vocabulary; the goal text names it.
Each turn the agent must say the next word; the admissible actions are the vocabulary. A correct word
advances; the last correct word wins (reward 10, terminated); ``max_steps`` wrong answers truncate.
The anchor is the (task, position) state, so GiGPO finds anchor groups. Deterministic by task id.
"""

from __future__ import annotations

import random

from interq.envs.base import Observation, ParsedAction, StepResult, TaskSpec

WORDS = ("apple", "bread", "cup", "egg", "fork", "knife", "lamp", "mug", "pan", "plate")


class ToyEnv:
    name = "toy"

    def __init__(self, length: int = 3, num_words: int = 6, max_steps: int = 8, tasks_per_split: int = 64) -> None:
        self.length, self.words, self.max_steps = length, WORDS[:num_words], max_steps
        self.tasks_per_split = tasks_per_split
        self._task: TaskSpec | None = None
        self._target: tuple[str, ...] = ()
        self._pos = 0
        self._steps = 0
        self._done = True

    def tasks(self, split: str) -> list[TaskSpec]:
        offset = {"train": 0, "valid_seen": 10_000, "valid_unseen": 20_000}.get(split)
        if offset is None:
            raise ValueError(f"toy: unknown split {split!r}; accepted: train, valid_seen, valid_unseen")
        out = []
        for i in range(self.tasks_per_split):
            rng = random.Random(offset + i)
            target = tuple(rng.choice(self.words) for _ in range(self.length))
            out.append(TaskSpec(env="toy", task_id=f"{split}-{i}", split=split, task_type="sequence",
                                description="say " + " then ".join(target)))
        return out

    def _obs(self, text: str) -> Observation:
        return Observation(text=text, admissible_actions=self.words, anchor=f"{self._task.task_id}@{self._pos}",
                           task=self._task)

    def reset(self, task: TaskSpec) -> Observation:
        self._task = task
        self._target = tuple(task.description[4:].split(" then "))
        self._pos, self._steps, self._done = 0, 0, False
        return self._obs(f"word {self._pos + 1} of {self.length}?")

    def expert_action(self) -> str:
        return self._target[self._pos]

    def parse_action(self, generated_text: str) -> ParsedAction:
        text = str(generated_text).strip().lower()
        return ParsedAction(action=text, valid=text in self.words)

    def step(self, action: str) -> StepResult:
        if self._done:
            raise RuntimeError("toy: step() after the episode ended; call reset()")
        self._steps += 1
        action = str(action).strip().lower()
        valid = action in self.words
        correct = action == self._target[self._pos]
        if correct:
            self._pos += 1
        won = self._pos == self.length
        truncated = not won and self._steps >= self.max_steps
        self._done = won or truncated
        text = "done" if won else f"{'correct' if correct else 'wrong'}. word {self._pos + 1} of {self.length}?"
        return StepResult(self._obs(text), 10.0 if won else 0.0, won, truncated, {"won": won, "valid_action": valid})

    def close(self) -> None:
        pass
