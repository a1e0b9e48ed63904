"""ScienceWorld, the real engine (extra ``interq[scienceworld]``, Java >= 11), behind the Env protocol.

- **One JVM per env**, heap capped: unless ``JAVA_TOOL_OPTIONS`` is already set, the JVM is started
  with ``DEFAULT_JAVA_OPTIONS`` (``java_options=``): ``-Xmx384m -XX:+UseSerialGC`` (260-290 MiB instead of
  ~970 MiB, same speed). Start-up takes about 2 s: build one env and reuse it across episodes.
- **Reproducible episodes**: ScienceWorld keeps a room's or container's objects in hash sets keyed by the
  JVM's identity hash, which differs from one JVM to the next. The order it lists objects in (``look
  around``) and the object an ambiguous action's first reading names then change between runs of the same
  seed. The default options also fix every identity hash (``-XX:hashCode=2``): the sets iterate in the
  order objects were made, so the same task and actions give the same text in every JVM. The price is
  about 1.1-1.2x per step (hash sets degrade to lists); ``java_options`` without it, or a
  ``JAVA_TOOL_OPTIONS`` of your own, gives the engine's run-to-run order back.
- **Fast step path**: ``step`` calls the server's step, score and completion only. ScienceWorld's own
  ``env.step`` re-lists every valid action on every step (about 3x slower); here the valid actions are
  computed only when asked: ``admissible_actions()``, or on every observation with ``admissible=True``.
- **Tasks and splits**: task ids are ``"<task name>:<variation>"``; ``tasks(split)`` lists, for the
  chosen task names (default all 30), the variations of ScienceWorld's own ``train`` / ``dev`` / ``test``
  split (``get_variations_train/dev/test``). ``simplification`` is passed to ``load`` (default
  ``"easy"``, the usual agent setting; ``""`` for none).
- **Reward**: the change of ScienceWorld's score (0-100) times ``reward_scale`` (default 1.0).
  ``terminated`` when the task is completed (``won`` iff the score reached 100) or failed: a failed
  task scores -100 and ends the episode at once. ``truncated`` at ``max_steps`` (default 100).
- **Bad input**: an action the parser does not know answers ScienceWorld's "No known action matches
  that input." with ``info["valid_action"] = False`` and costs a step; ``""`` and strings over
  ``MAX_ACTION_CHARS`` (1,000) are answered the same way without being sent to the JVM. An ambiguous
  action (ScienceWorld asks for a number) is resolved with its first reading (``"0"``), recorded
  in ``info["ambiguous"]``. ``step`` before ``reset`` or after the end raises :class:`EpisodeError`,
  a non-str action ``TypeError``, an unknown task :class:`UnknownTaskError`.
- **Expert**: ``expert_action()`` replays ScienceWorld's gold action sequence (``generateGoldPath``)
  while the episode has followed it; once an action leaves the gold path it returns None.
"""

from __future__ import annotations

import os
import threading

from .._optional import require
from .base import (EpisodeError, Observation, ParsedAction, StepResult, TaskSpec, UnknownTaskError, describe_splits,
                   extract_tagged_action)

SPLITS = ("train", "dev", "test")
# heap cap and serial GC (memory); a fixed identity hash (the same listing order and ambiguity readings in every JVM)
DEFAULT_JAVA_OPTIONS = "-Xmx384m -XX:+UseSerialGC -XX:+UnlockExperimentalVMOptions -XX:hashCode=2"
MAX_ACTION_CHARS = 1000
NO_MATCH = "No known action matches that input."
_env_lock = threading.Lock()


class ScienceWorldEnv:
    """The real ScienceWorld engine. See the module docstring for the contract.

    Args:
        task_names: restrict ``tasks(split)`` to these task names (default: all 30).
        simplification: ScienceWorld simplification string ("easy", "" or a comma list).
        max_steps: step limit (truncation), default 100 (ScienceWorld's own default).
        reward_scale: reward = delta score * reward_scale.
        admissible: put the valid actions in every observation (slow: ~3x per step).
        expert: generate gold paths at reset (``expert_action``).
        java_options: JVM options when ``JAVA_TOOL_OPTIONS`` is unset (heap cap, fixed identity hash).
        max_variations: cap the variations listed per task and split (None: all).
    """

    name = "scienceworld"

    def __init__(self, task_names: list[str] | None = None, simplification: str = "easy", max_steps: int = 100,
                 reward_scale: float = 1.0, admissible: bool = False, expert: bool = True,
                 java_options: str | None = DEFAULT_JAVA_OPTIONS, max_variations: int | None = None):
        sw = require("scienceworld", "scienceworld")
        if not isinstance(max_steps, int) or isinstance(max_steps, bool) or max_steps < 1:
            raise ValueError(f"max_steps must be a positive int; got {max_steps!r}")
        if max_variations is not None and (not isinstance(max_variations, int) or max_variations < 1):
            raise ValueError(f"max_variations must be None or a positive int; got {max_variations!r}")
        self.max_steps = max_steps
        self.reward_scale = float(reward_scale)
        self.admissible = bool(admissible)
        self.expert = bool(expert)
        self.simplification = simplification
        self.max_variations = max_variations
        with _env_lock:
            saved = os.environ.get("JAVA_TOOL_OPTIONS")
            if saved is None and java_options:
                os.environ["JAVA_TOOL_OPTIONS"] = java_options
            try:
                # envStepLimit is ours to enforce (truncation); keep the engine's own limit out of the way
                self._sw = sw.ScienceWorldEnv("", envStepLimit=10 ** 9)
            finally:
                if saved is None:
                    os.environ.pop("JAVA_TOOL_OPTIONS", None)
        self.all_task_names = list(self._sw.get_task_names())
        if task_names is not None:
            unknown = [t for t in task_names if t not in self.all_task_names]
            if unknown:
                self.close()
                raise ValueError(f"task_names: unknown {unknown}; accepted: {self.all_task_names}")
        self.task_names = list(task_names) if task_names is not None else list(self.all_task_names)
        self._splits: dict[str, list[TaskSpec]] = {}
        self._variations: dict[tuple[str, str], list[int]] = {}
        self._task: TaskSpec | None = None
        self._done = True
        self._started = False
        self._steps = 0
        self._score = 0
        self._gold: list[str] | None = None
        self._on_gold = False

    # ---- tasks -----------------------------------------------------------------------------
    def variations(self, task_name: str, split: str) -> list[int]:
        if split not in SPLITS:
            raise ValueError(f"split must be one of {list(SPLITS)}; got {split!r}")
        if task_name not in self.all_task_names:
            raise UnknownTaskError(f"unknown ScienceWorld task {task_name!r}; accepted: {self.all_task_names}")
        key = (task_name, split)
        if key not in self._variations:  # one load lists the task's three splits
            self._sw.load(task_name, 0, self.simplification, generateGoldPath=False)
            for s, getter in (("train", self._sw.get_variations_train), ("dev", self._sw.get_variations_dev),
                              ("test", self._sw.get_variations_test)):
                self._variations[(task_name, s)] = sorted(int(v) for v in getter())
            self._started = False
            self._done = True
        return list(self._variations[key])

    def info(self) -> dict:
        """What this env plays, for the run's records (``env_info.json``; the warm start's ``policy_summary.json``):
        the engine and its version, the JVM, the tasks and each split's size and task types (after
        ``max_variations``), and the episode settings. Lists every split (one ``load`` per task, about 0.1 s each,
        shared with ``tasks``); ends any running episode, like ``tasks`` does."""
        from importlib.metadata import PackageNotFoundError, version

        try:
            engine_version = version("scienceworld")
        except PackageNotFoundError:  # pragma: no cover - imported, so installed
            engine_version = "unknown"
        try:  # the JVM this env talks to (py4j gateway of the scienceworld package)
            system = self._sw._gateway.jvm.java.lang.System
            runtime = self._sw._gateway.jvm.java.lang.Runtime.getRuntime()
            java = {"version": str(system.getProperty("java.version")), "vm": str(system.getProperty("java.vm.name")),
                    "max_heap_mib": int(runtime.maxMemory()) // 2 ** 20,
                    "fixed_identity_hash": self.fixed_identity_hash()}
        except Exception as e:  # noqa: BLE001 - a record, not a requirement
            java = {"version": f"unknown ({type(e).__name__})"}
        return {"env": self.name, "engine": "ScienceWorld", "version": f"scienceworld {engine_version}", "java": java,
                "source": "ScienceWorld's task variations and its train/dev/test split",
                "task_names": list(self.task_names), "max_variations": self.max_variations,
                "simplification": self.simplification, **describe_splits(self, SPLITS), "max_steps": self.max_steps,
                "reward_scale": self.reward_scale, "admissible": self.admissible}

    def fixed_identity_hash(self) -> bool:
        """Whether this env's JVM gives every object the same identity hash (module docstring: reproducible
        episodes); False under a ``JAVA_TOOL_OPTIONS`` or ``java_options`` without ``-XX:hashCode=2``."""
        jvm = self._sw._gateway.jvm
        return {int(jvm.java.lang.System.identityHashCode(jvm.java.lang.Object())) for _ in range(3)} == {1}

    def tasks(self, split: str) -> list[TaskSpec]:
        if split not in SPLITS:
            raise ValueError(f"split must be one of {list(SPLITS)}; got {split!r}")
        if split not in self._splits:
            specs = []
            for t in self.task_names:
                vs = self.variations(t, split)
                if self.max_variations is not None:
                    vs = vs[: self.max_variations]
                specs += [TaskSpec("scienceworld", f"{t}:{v}", split, t, "") for v in vs]
            self._splits[split] = specs
        return list(self._splits[split])

    def _parse_task(self, task: TaskSpec | str) -> tuple[str, int, TaskSpec]:
        if isinstance(task, TaskSpec):
            if task.env != self.name:
                raise UnknownTaskError(f"task {task.task_id!r} belongs to env {task.env!r}, not 'scienceworld'")
            task_id = task.task_id
        elif isinstance(task, str):
            task_id = task
        else:
            raise TypeError(f"task must be a TaskSpec or a '<task name>:<variation>' str; got {type(task).__name__}")
        name, _, var = task_id.rpartition(":")
        if not name or not var.isdigit():
            raise UnknownTaskError(f"bad ScienceWorld task id {task_id!r}: expected '<task name>:<variation>', "
                                   f"e.g. 'boil:0'")
        if name not in self.all_task_names:
            raise UnknownTaskError(f"unknown ScienceWorld task {name!r}; accepted: {self.all_task_names}")
        v = int(var)
        n = int(self._sw.get_max_variations(name))
        if v >= n:
            raise UnknownTaskError(f"ScienceWorld task {name!r} has variations 0-{n - 1}; got {v}")
        spec = task if isinstance(task, TaskSpec) else TaskSpec("scienceworld", task_id, "", name, "")
        return name, v, spec

    # ---- episode ---------------------------------------------------------------------------
    def reset(self, task: TaskSpec | str) -> Observation:
        name, var, spec = self._parse_task(task)
        self._sw.load(name, var, self.simplification, generateGoldPath=self.expert)
        obs, _info = self._sw.reset()
        desc = str(self._sw.taskdescription()).strip()
        self._task = TaskSpec(spec.env, spec.task_id, spec.split, name, desc)
        self._gold = list(self._sw.get_gold_action_sequence()) if self.expert else None
        self._on_gold = self.expert
        self._steps = 0
        self._score = int(round(100 * self._sw.server.getScore()))
        self._done = False
        self._started = True
        text = f"{desc}\n\n{obs}".strip()
        return Observation(text=text, admissible_actions=self._adm() if self.admissible else None, anchor=str(obs),
                           task=self._task)

    def _adm(self) -> tuple[str, ...]:
        return tuple(sorted(set(self._sw.get_valid_action_object_combinations())))

    def admissible_actions(self) -> tuple[str, ...]:
        """ScienceWorld's valid action-object combinations in the current state (slow: ~100 ms)."""
        if not self._started:
            raise EpisodeError("no episode: call reset(task) first")
        return self._adm()

    @property
    def score(self) -> int:
        return self._score

    def step(self, action: str) -> StepResult:
        if not self._started:
            raise EpisodeError("step() before reset(): call reset(task) first")
        if self._done:
            raise EpisodeError(f"episode of task {self._task.task_id!r} has ended; call reset(task) before step()")
        if not isinstance(action, str):
            raise TypeError(f"action must be a str (use parse_action on generated text); got {type(action).__name__}")
        act = " ".join(action.split())
        ambiguous = False
        if not act or len(act) > MAX_ACTION_CHARS:
            obs = NO_MATCH
        else:
            obs = str(self._sw.server.step(act))
            if obs.startswith("Ambiguous request"):
                ambiguous = True
                obs = str(self._sw.server.step("0"))
        valid = not obs.startswith(NO_MATCH)
        if self._on_gold and (self._gold is None or self._steps >= len(self._gold) or self._gold[self._steps] != act):
            self._on_gold = False
        self._steps += 1
        score = int(round(100 * self._sw.server.getScore()))
        completed = bool(self._sw.server.getCompleted())
        reward = (score - self._score) * self.reward_scale
        self._score = score
        failed = score < 0
        won = completed and score >= 100
        terminated = completed or failed
        truncated = (not terminated) and self._steps >= self.max_steps
        self._done = terminated or truncated
        info = {"won": won, "valid_action": valid, "step": self._steps, "score": score, "failed": failed,
                "task_id": self._task.task_id, "task_type": self._task.task_type, "ambiguous": ambiguous}
        o = Observation(text=obs, admissible_actions=self._adm() if self.admissible else None, anchor=obs,
                        task=self._task)
        return StepResult(o, reward, terminated, truncated, info)

    def parse_action(self, generated_text: str) -> ParsedAction:
        return extract_tagged_action(generated_text, lower=True)

    def gold_actions(self) -> list[str] | None:
        """ScienceWorld's gold action sequence of the current task (None when ``expert=False``)."""
        return list(self._gold) if self._gold is not None else None

    def expert_action(self) -> str | None:
        if not self._started or self._done or not self._on_gold or self._gold is None:
            return None
        return self._gold[self._steps] if self._steps < len(self._gold) else None

    def close(self) -> None:
        sw = getattr(self, "_sw", None)
        if sw is not None:
            try:
                sw.close()
            except Exception:
                pass
            self._sw = None
        self._started = False


def make_env(**kwargs) -> ScienceWorldEnv:
    return ScienceWorldEnv(**kwargs)


__all__ = ["ScienceWorldEnv", "SPLITS", "MAX_ACTION_CHARS", "make_env"]
