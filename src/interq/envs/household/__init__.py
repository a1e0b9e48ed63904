"""``household``: a fast, pure-Python environment that speaks ALFWorld's text.

- :mod:`.world`: the task as plain frozen data (:class:`HouseholdWorld`) in ALFWorld's vocabulary;
- :mod:`.generator`: deterministic procedural rooms and tasks, seen/unseen scene splits;
- :mod:`.engine`: ALFWorld's rules and text (admissible commands, feedback, goals, expert);
- :mod:`.env`: :class:`HouseholdEnv`, the :class:`interq.envs.base.Env` implementation.

``build_env(world)`` makes an env that plays exactly the given world(s).
"""
from .engine import HouseholdGame
from .env import HouseholdEnv
from .generator import SPLITS, generate_split, generate_world, parse_task_id, scene_layout, task_id_for
from .world import TASK_TYPES, GoalSpec, HouseholdWorld, ObjectSpec, ReceptacleSpec


def build_env(*worlds: HouseholdWorld, **kwargs) -> HouseholdEnv:
    """A HouseholdEnv whose tasks are exactly ``worlds`` (kwargs: max_steps, success_reward)."""
    return HouseholdEnv(worlds=worlds, **kwargs)


__all__ = ["TASK_TYPES", "GoalSpec", "HouseholdWorld", "ObjectSpec", "ReceptacleSpec", "SPLITS", "HouseholdEnv",
           "HouseholdGame", "build_env", "generate_split", "generate_world", "parse_task_id", "scene_layout",
           "task_id_for"]
