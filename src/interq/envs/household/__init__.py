"""``household``: a fast, pure-Python environment that speaks ALFWorld's text (see engine.py)."""
from .world import TASK_TYPES, GoalSpec, HouseholdWorld, ObjectSpec, ReceptacleSpec
from .generator import SPLITS, generate_split, generate_world, scene_layout

__all__ = ["TASK_TYPES", "GoalSpec", "HouseholdWorld", "ObjectSpec", "ReceptacleSpec", "SPLITS",
           "generate_split", "generate_world", "scene_layout"]
