"""``AlfworldEnv``: the real ALFWorld TextWorld engine behind :class:`interq.envs.base.Env`.

Games come from one of three sources (``source=``):

- ``"official"``: ALFWorld's released games under ``$ALFWORLD_DATA`` (or ``data_path``), found the way
  ``AlfredTWEnv`` finds them (``traj_data.json`` + ``game.tw-pddl`` with ``solvable: true``; movable and
  sliced trials skipped), in the standard splits ``json_2.1.1/{train,valid_seen,valid_unseen}``
  (3,553 / 140 / 134 games once ``alfworld-download`` has run). Task ids are the trial directories
  relative to the split directory.
- ``"generated"`` (offline): games written by :mod:`.layouts` + :mod:`.export` from the scene layouts
  the wheel ships, the six task types balanced, ``train``/``valid_seen`` on seen scenes and
  ``valid_unseen`` on unseen ones; written lazily under ``cache_dir`` (default
  ``$INTERQ_CACHE/alfworld_games`` or ``~/.cache/interq/alfworld_games``). Task ids ``<split>-<index>``.
- ``"auto"`` (default): ``"official"`` when ``ALFWORLD_DATA`` points at a directory with the splits,
  else ``"generated"``; the choice and why is said on stderr (once per process) and reported by ``info()``
  (``source``, ``source_reason``), which the trainer keeps (``env_info.json`` in the run directory).
- ``worlds=[HouseholdWorld, ...]``: play exactly these worlds, exported as games (the fidelity check).

Episode contract (the same as ``household``; verl-agent's ALFWorld conventions):

- ``reset`` returns the engine's intro without TextWorld's banner line; ``admissible_actions`` is the
  engine's ``admissible_commands`` without ``help``; ``anchor`` is the raw engine text.
- ``step(action)``: the engine matches the stripped command exactly against its admissible
  commands; anything else (``""``, a 100 KB string, a typo) answers the engine's "Nothing happens."
  with ``info["valid_action"] = False`` and costs a step.
- Reward ``success_reward`` (10.0) on the winning step, 0 otherwise; success terminates; ``max_steps``
  (50) without success truncates.
- ``step`` before ``reset`` or after the end raises :class:`EpisodeError`; a non-str action raises
  ``TypeError``; an unknown task raises :class:`UnknownTaskError`.
- ``expert_action()``: ALFWorld's handcoded expert (``extra.expert_plan``; ``expert=True``).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Iterable

from ..._optional import require
from ..base import (EpisodeError, Observation, ParsedAction, StepResult, TaskSpec, UnknownTaskError, describe_splits,
                    extract_tagged_action, resolve_split_sizes)
from ..household.world import ALFRED_TASK_TYPE, HouseholdWorld

SPLITS = ("train", "valid_seen", "valid_unseen")
OFFICIAL_SPLIT_DIRS = {"train": "json_2.1.1/train", "valid_seen": "json_2.1.1/valid_seen",
                       "valid_unseen": "json_2.1.1/valid_unseen"}
DEFAULT_SPLIT_SIZES = {"train": 3553, "valid_seen": 140, "valid_unseen": 134}
SOURCES = ("auto", "official", "generated")
BANNER = "-= Welcome to TextWorld, ALFRED! =-"
_SHORT_TYPE = {v: k for k, v in ALFRED_TASK_TYPE.items()}


_SAID: set[str] = set()


def _say_once(line: str) -> None:
    """One line on stderr, once per process (envs are built again for every worker and rollout)."""
    if line not in _SAID:
        _SAID.add(line)
        print(line, file=sys.stderr, flush=True)


def strip_banner(text: str) -> str:
    t = text.lstrip("\n")
    if t.startswith(BANNER):
        t = t[len(BANNER):].lstrip("\n")
    return t


def default_cache_dir() -> Path:
    base = os.environ.get("INTERQ_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "interq")
    return Path(base) / "alfworld_games"


def official_data_path(data_path: str | os.PathLike | None = None) -> Path | None:
    """The ALFWorld data directory if it holds the standard splits, else None."""
    p = data_path or os.environ.get("ALFWORLD_DATA")
    if not p:
        return None
    p = Path(os.path.expandvars(str(p))).expanduser()
    return p if any((p / d).is_dir() for d in OFFICIAL_SPLIT_DIRS.values()) else None


def collect_official_games(root: Path, split: str) -> list[tuple[str, Path, str]]:
    """(task_id, game file, task type) of the solvable games of a split, sorted (AlfredTWEnv's filter)."""
    base = root / OFFICIAL_SPLIT_DIRS[split]
    out = []
    if not base.is_dir():
        return out
    for dirpath, _dirs, files in os.walk(base):
        if "traj_data.json" not in files or "game.tw-pddl" not in files:
            continue
        if "movable" in dirpath or "Sliced" in dirpath:
            continue
        game = Path(dirpath) / "game.tw-pddl"
        try:
            with open(game) as f:
                if not json.load(f).get("solvable", False):
                    continue
            with open(Path(dirpath) / "traj_data.json") as f:
                ttype = json.load(f)["task_type"]
        except (OSError, ValueError, KeyError):
            continue
        if ttype not in _SHORT_TYPE:
            continue
        out.append((str(Path(dirpath).relative_to(base)), game, _SHORT_TYPE[ttype]))
    out.sort()
    return out


class AlfworldEnv:
    """The real ALFWorld engine (TextWorld PDDL backend + ALFWorld's wrappers). See module docstring.

    Args:
        source: "auto" | "official" | "generated".
        data_path: ALFWorld data directory (default ``$ALFWORLD_DATA``), for "official".
        seed: task set of "generated".
        split_sizes: tasks per split for "generated" (default ALFWorld's 3553 / 140 / 134).
        cache_dir: where generated games are written.
        worlds: play exactly these household worlds (exported to games under ``cache_dir``).
        max_steps, success_reward: episode limits and reward (50, 10.0).
        expert: run ALFWorld's handcoded expert (``expert_action``); costs some time per step.
        fast: memoise TextWorld's grammar parsing (same output, about 2x faster steps; see ``speedup``).
    """

    name = "alfworld"

    def __init__(self, source: str = "auto", data_path: str | os.PathLike | None = None, seed: int = 0,
                 split_sizes: dict[str, int] | None = None, cache_dir: str | os.PathLike | None = None,
                 worlds: Iterable[HouseholdWorld] | None = None, max_steps: int = 50,
                 success_reward: float = 10.0, expert: bool = True, fast: bool = True):
        require("alfworld", "alfworld")
        require("textworld", "alfworld")
        if source not in SOURCES:
            raise ValueError(f"source must be one of {list(SOURCES)}; got {source!r}")
        if not isinstance(max_steps, int) or isinstance(max_steps, bool) or max_steps < 1:
            raise ValueError(f"max_steps must be a positive int; got {max_steps!r}")
        self.max_steps = max_steps
        self.success_reward = float(success_reward)
        self.expert = bool(expert)
        self.seed = int(seed)
        self.cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()
        sizes = resolve_split_sizes(DEFAULT_SPLIT_SIZES, split_sizes)
        self.split_sizes = sizes
        self._worlds: dict[str, HouseholdWorld] | None = None
        self._official: Path | None = None
        self.source_reason = f"source={source!r}" if worlds is None else "worlds given"
        if worlds is not None:
            self._worlds = {}
            for w in worlds:
                if w.task_id in self._worlds:
                    raise ValueError(f"worlds: duplicate task_id {w.task_id!r}")
                self._worlds[w.task_id] = w
            self.source = "worlds"
        else:
            official = official_data_path(data_path)
            if source == "official" and official is None:
                raise FileNotFoundError(
                    f"source='official' needs ALFWorld's games: set ALFWORLD_DATA (now "
                    f"{os.environ.get('ALFWORLD_DATA')!r}) or data_path to the directory holding "
                    f"{sorted(OFFICIAL_SPLIT_DIRS.values())} (run alfworld-download where the internet is "
                    f"reachable), or use source='generated'")
            if source == "official" or (source == "auto" and official is not None):
                self.source, self._official = "official", official
            else:
                self.source = "generated"
            if source == "auto":
                where = (f"data_path={str(data_path)!r}" if data_path else
                         f"ALFWORLD_DATA={os.environ.get('ALFWORLD_DATA')!r}")
                self.source_reason = (
                    f"source='auto' chose 'official': ALFWorld's games under {official}" if official is not None else
                    f"source='auto' chose 'generated' (games written from the scene layouts the wheel ships, not "
                    f"ALFWorld's released games): {where} holds none of {sorted(OFFICIAL_SPLIT_DIRS.values())}")
                _say_once(f"interq: alfworld: {self.source_reason}")
        if fast:
            from . import speedup
            speedup.install()
        self._specs: dict[str, list[TaskSpec]] = {}
        self._games: dict[tuple[str, str], Path] = {}
        self._gen: dict[tuple[str, int], tuple] = {}
        self._env = None
        self._state = None
        self._task: TaskSpec | None = None
        self._steps = 0
        self._done = False

    def info(self) -> dict:
        """What this env plays, for the run's records (``env_info.json``; the warm start's ``policy_summary.json``):
        the engine and its versions, the game source and why it was chosen, each split's size and task types, and
        the episode settings. Generated games' types follow from their index (``TASK_TYPES[index % 6]``, nothing
        is generated here); official games are listed (one ``traj_data.json`` read per game, once per env)."""
        from importlib.metadata import PackageNotFoundError, version

        def _version(package: str) -> str:
            try:
                return f"{package} {version(package)}"
            except PackageNotFoundError:  # pragma: no cover - imported in __init__, so installed
                return f"{package} unknown"

        out = {"env": self.name, "engine": "ALFWorld's TextWorld engine (PDDL games)",
               "version": f"{_version('alfworld')}, {_version('textworld')}",
               "source": self.source, "source_reason": self.source_reason}
        if self.source == "official":
            out["data_path"] = str(self._official)
        if self.source == "generated":
            from .layouts import TASK_TYPES

            out.update(seed=self.seed, split_sizes=dict(self.split_sizes), task_types={})
            for split, n in self.split_sizes.items():
                counts = {t: len(range(i, n, len(TASK_TYPES))) for i, t in enumerate(TASK_TYPES)}
                out["task_types"][split] = {t: c for t, c in counts.items() if c}
        else:
            splits = SPLITS if self.source == "official" else dict.fromkeys(w.split for w in self._worlds.values())
            out.update(describe_splits(self, list(splits)))
        out.update(max_steps=self.max_steps, success_reward=self.success_reward, expert=self.expert)
        return out

    # ---- tasks -----------------------------------------------------------------------------
    def _generated(self, split: str, index: int):
        key = (split, index)
        if key not in self._gen:
            from .layouts import layout_world
            self._gen[key] = layout_world(split, index, self.seed)
        return self._gen[key]

    def tasks(self, split: str) -> list[TaskSpec]:
        if self.source == "worlds":
            return [TaskSpec("alfworld", w.task_id, w.split, w.task_type, w.goal.text)
                    for w in self._worlds.values() if w.split == split]
        if split not in SPLITS:
            raise ValueError(f"split must be one of {list(SPLITS)}; got {split!r}")
        if split not in self._specs:
            specs = []
            if self.source == "official":
                for tid, game, ttype in collect_official_games(self._official, split):
                    self._games[(split, tid)] = game
                    specs.append(TaskSpec("alfworld", tid, split, ttype, ""))
            else:
                for i in range(self.split_sizes[split]):
                    w = self._generated(split, i)[0]
                    specs.append(TaskSpec("alfworld", w.task_id, split, w.task_type, w.goal.text))
            self._specs[split] = specs
        return list(self._specs[split])

    def game_file(self, task: TaskSpec | str) -> Path:
        """The ``game.tw-pddl`` of a task (written first for generated tasks and worlds)."""
        from .export import write_game

        if isinstance(task, TaskSpec):
            if task.env != self.name:
                raise UnknownTaskError(f"task {task.task_id!r} belongs to env {task.env!r}, not 'alfworld'")
            task_id, split = task.task_id, task.split
        elif isinstance(task, str):
            task_id, split = task, None
        else:
            raise TypeError(f"task must be a TaskSpec or a task_id str; got {type(task).__name__}")
        if self.source == "worlds":
            w = self._worlds.get(task_id)
            if w is None:
                raise UnknownTaskError(f"unknown alfworld task_id {task_id!r}; this env plays "
                                       f"{len(self._worlds)} worlds, e.g. {list(self._worlds)[:3]}")
            d = self.cache_dir / "worlds" / _world_key(w)
            return d / "game.tw-pddl" if (d / "game.tw-pddl").exists() else write_game(w, d)
        if self.source == "official":
            splits = [split] if split else list(SPLITS)
            for s in splits:
                if s not in SPLITS:
                    raise UnknownTaskError(f"unknown split {s!r}; accepted: {list(SPLITS)}")
                self.tasks(s)
                if (s, task_id) in self._games:
                    return self._games[(s, task_id)]
            raise UnknownTaskError(f"unknown alfworld task {task_id!r} in split(s) {splits} of {self._official}")
        # generated
        s, _, idx = task_id.rpartition("-")
        if s not in SPLITS or not idx.isdigit() or (split is not None and split != s):
            raise UnknownTaskError(f"unknown generated alfworld task {task_id!r}; ids are '<split>-<index>' with "
                                   f"split in {list(SPLITS)} (e.g. 'train-00003')")
        i = int(idx)
        if i >= self.split_sizes[s]:
            raise UnknownTaskError(f"unknown alfworld task {task_id!r}: split {s!r} has {self.split_sizes[s]} tasks")
        world, places, agent = self._generated(s, i)
        # keyed by the world's content too, so a changed generator never reuses a stale game
        d = self.cache_dir / f"seed{self.seed}" / s / _world_key(world)
        if (d / "game.tw-pddl").exists():
            return d / "game.tw-pddl"
        return write_game(world, d, places, agent)

    # ---- episode ---------------------------------------------------------------------------
    def _spec_for(self, task: TaskSpec | str, game: Path) -> TaskSpec:
        if isinstance(task, TaskSpec):
            return task
        with open(game.parent / "traj_data.json") as f:
            traj = json.load(f)
        split = task.rpartition("-")[0] if self.source == "generated" else ""
        return TaskSpec("alfworld", task, split, _SHORT_TYPE.get(traj["task_type"]), "")

    def reset(self, task: TaskSpec | str) -> Observation:
        import textworld
        from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos

        game = self.game_file(task)
        self.close()
        infos = textworld.EnvInfos(won=True, admissible_commands=True, facts=self.expert,
                                   extras=["gamefile"] + (["expert_plan"] if self.expert else []))
        wrappers = [AlfredDemangler(), AlfredInfos] + ([_expert_wrapper()] if self.expert else [])
        self._env = textworld.start(str(game), infos, wrappers=wrappers)
        self._state = self._env.reset()
        spec = self._spec_for(task, game)
        if not spec.description:
            goal = self._state.feedback.rpartition("Your task is to: ")[2].strip()
            spec = TaskSpec(spec.env, spec.task_id, spec.split, spec.task_type, goal)
        self._task = spec
        self._steps = 0
        self._done = False
        text = strip_banner(self._state.feedback)
        return Observation(text=text, admissible_actions=self.admissible_actions(), anchor=text, task=spec)

    def admissible_actions(self) -> tuple[str, ...]:
        if self._state is None:
            raise EpisodeError("no episode: call reset(task) first")
        return tuple(c for c in self._state["admissible_commands"] if c != "help")

    def step(self, action: str) -> StepResult:
        if self._env is None or self._state is None:
            raise EpisodeError("step() before reset(): call reset(task) first")
        if self._done:
            raise EpisodeError(f"episode of task {self._task.task_id!r} has ended; call reset(task) before step()")
        if not isinstance(action, str):
            raise TypeError(f"action must be a str (use parse_action on generated text); got {type(action).__name__}")
        valid = action.strip() in self._state["admissible_commands"]
        # an inadmissible command cannot change the state: the engine answers "Nothing happens."
        self._state, _score, _done = self._env.step(action if valid else "")
        if not valid and self._state.feedback != "Nothing happens.":  # pragma: no cover - engine contract
            raise RuntimeError(f"engine answered {self._state.feedback!r} to an inadmissible command")
        self._steps += 1
        won = bool(self._state["won"])
        truncated = (not won) and self._steps >= self.max_steps
        self._done = won or truncated
        text = self._state.feedback
        obs = Observation(text=text, admissible_actions=self.admissible_actions(), anchor=text, task=self._task)
        info = {"won": won, "valid_action": valid, "step": self._steps, "task_id": self._task.task_id,
                "task_type": self._task.task_type}
        return StepResult(obs, self.success_reward if won else 0.0, won, truncated, info)

    def parse_action(self, generated_text: str) -> ParsedAction:
        return extract_tagged_action(generated_text, lower=True)

    def expert_action(self) -> str | None:
        """ALFWorld's handcoded expert's next action (``extra.expert_plan``); None after the end."""
        if self._state is None or self._done or not self.expert:
            return None
        plan = self._state.get("extra.expert_plan") or []
        return plan[0] if plan else None

    @property
    def state(self):
        """The raw TextWorld game state of the running episode (facts, feedback, ...)."""
        return self._state

    def close(self) -> None:
        if self._env is not None:
            try:
                self._env.close()
            except Exception:
                pass
        self._env = None
        self._state = None


def _expert_view(command: str) -> str:
    """The command as ALFWorld's handcoded expert's state tracker understands it.

    alfworld 0.4's grammar says ``move X to Y`` where older grammars said ``put X in/on Y``; the expert
    emits ``move ...`` but its tracker (``BasePolicy.update_state_tracking``) still looks for ``"put"``
    to drop the object from its inventory. Without this it keeps a stale inventory after the first
    put and fails two-object tasks (it asks to move the object it already put).
    """
    if command.startswith("move ") and " to " in command:
        obj, _, recep = command[len("move "):].partition(" to ")
        return f"put {obj} in {recep}"
    return command


def _expert_wrapper():
    import textworld
    from alfworld.agents.environment.alfred_tw_env import AlfredExpert

    class _AlfredExpert(AlfredExpert):
        """ALFWorld's AlfredExpert, its handcoded expert fed ``_expert_view(command)`` as last action."""

        def step(self, command):
            self.state, reward, done = textworld.core.Wrapper.step(self, command)
            self.prev_command = _expert_view(str(command))
            self._gather_infos()
            return self.state, reward, done

    return _AlfredExpert()


def _world_key(w: HouseholdWorld) -> str:
    import hashlib
    h = hashlib.sha256(json.dumps(w.to_dict(), sort_keys=True).encode()).hexdigest()[:16]
    return f"{w.task_id}-{h}"
