"""ALFWorld, the real engine (extra ``interq[alfworld]``), and its offline game generator.

- :mod:`.env`: :class:`AlfworldEnv` (official games under ``$ALFWORLD_DATA``, generated games, or
  given household worlds), behind ``make_env("alfworld")``;
- :mod:`.layouts`: tasks of ALFWorld's six types on the AI2-THOR scene layouts the wheel ships;
- :mod:`.export`: a :class:`~interq.envs.household.HouseholdWorld` -> ``game.tw-pddl`` + ``traj_data.json``;
- :mod:`.fidelity`: the household expert's plan walked in both engines, compared step by step;
- :mod:`.speedup`: memoised TextWorld grammar parsing (same output, faster steps).

Importing this package does not import ``alfworld``; building an env does (a clear error names the
install command when it is missing).
"""

from .env import SPLITS, AlfworldEnv, collect_official_games, official_data_path


def make_env(**kwargs) -> AlfworldEnv:
    return AlfworldEnv(**kwargs)


__all__ = ["AlfworldEnv", "SPLITS", "collect_official_games", "make_env", "official_data_path"]
