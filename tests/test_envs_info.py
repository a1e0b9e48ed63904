"""Each environment's ``info()``: what a reader of a run needs to know about what it played (engine and version, where
the tasks come from, split sizes, task types, episode settings), kept by ``interq train`` in ``env_info.json``
(tests/test_train_envs.py checks the runs). Calling it changes nothing an episode sees."""

from __future__ import annotations

import json
import shutil

import pytest

from interq.envs import make_env

HOUSEHOLD_TYPES = ["pick_and_place", "look_at_obj_in_light", "pick_clean_then_place", "pick_heat_then_place",
                   "pick_cool_then_place", "pick_two_obj"]


def _expert_episode(env, task, max_steps=60):
    """Everything the agent sees along the expert's episode of ``task``."""
    obs = env.reset(task)
    seen = [(obs.text, obs.admissible_actions, obs.anchor)]
    for _ in range(max_steps):
        action = env.expert_action()
        if action is None:
            break
        r = env.step(action)
        seen.append((action, r.observation.text, r.observation.admissible_actions, r.reward, r.terminated,
                     r.truncated, sorted(r.info.items())))
        if r.terminated or r.truncated:
            break
    return seen


def _check_splits(info, env, splits):
    assert list(info["split_sizes"]) == list(splits) and list(info["task_types"]) == list(splits)
    for s in splits:
        tasks = env.tasks(s)
        assert info["split_sizes"][s] == len(tasks) == sum(info["task_types"][s].values())
        assert set(info["task_types"][s]) == {t.task_type for t in tasks}
    json.dumps(info)  # a record: plain JSON


@pytest.mark.parametrize("kwargs", [{}, {"size": "small", "shuffle_actions": True, "seed": 3,
                                         "split_sizes": {"train": 10, "valid_seen": 4, "valid_unseen": 7}}])
def test_household_info(kwargs):
    from interq import __version__

    env = make_env("household", **kwargs)
    info = env.info()
    assert info["env"] == "household" and "built-in" in info["engine"] and info["version"] == f"interq {__version__}"
    assert info["source"] == "generated" and info["seed"] == kwargs.get("seed", 0)
    assert info["size"] == kwargs.get("size", "full") and info["shuffle_actions"] == kwargs.get("shuffle_actions", False)
    assert (info["expert"], info["max_steps"], info["success_reward"]) == ("explore", 50, 10.0)
    _check_splits(info, env, ("train", "valid_seen", "valid_unseen"))
    if not kwargs:  # ALFWorld's split sizes, every split balanced over its six task types
        assert info["split_sizes"] == {"train": 3553, "valid_seen": 140, "valid_unseen": 134}
        assert all(list(info["task_types"][s]) == HOUSEHOLD_TYPES for s in info["task_types"])
        assert info["task_types"]["valid_unseen"]["pick_and_place"] == 23


def test_household_info_of_given_worlds():
    from interq.envs.household import build_env, generate_world

    worlds = [generate_world("valid_unseen", 2), generate_world("train", 0), generate_world("train", 7)]
    info = build_env(*worlds).info()
    assert info["source"] == "worlds" and "seed" not in info
    assert info["split_sizes"] == {"valid_unseen": 1, "train": 2}
    assert info["task_types"]["train"] == {"pick_and_place": 1, "look_at_obj_in_light": 1}


@pytest.mark.alfworld
def test_alfworld_info(tmp_path):
    pytest.importorskip("alfworld", reason="could not import 'alfworld' (extra interq[alfworld])")
    from importlib.metadata import version

    from interq.envs.household import generate_world

    sizes = {"train": 13, "valid_seen": 4, "valid_unseen": 7}
    env = make_env("alfworld", source="generated", seed=2, split_sizes=sizes, cache_dir=tmp_path)
    info = env.info()
    assert info["env"] == "alfworld" and "TextWorld" in info["engine"]
    assert info["version"] == f"alfworld {version('alfworld')}, textworld {version('textworld')}"
    assert (info["source"], info["seed"], info["source_reason"]) == ("generated", 2, "source='generated'")
    assert (info["max_steps"], info["success_reward"], info["expert"]) == (50, 10.0, True)
    _check_splits(info, env, ("train", "valid_seen", "valid_unseen"))  # the types from the index = the games' own
    assert info["task_types"]["train"]["pick_and_place"] == 3 and len(info["task_types"]["valid_seen"]) == 4
    worlds = [generate_world("valid_unseen", 2), generate_world("train", 0), generate_world("train", 7)]
    given = make_env("alfworld", worlds=worlds, cache_dir=tmp_path).info()
    assert given["source"] == "worlds" and "seed" not in given and given["split_sizes"] == {"valid_unseen": 1, "train": 2}
    json.dumps(given)


@pytest.mark.parametrize("name, kwargs, split", [
    ("household", {"split_sizes": {"train": 6}}, "train"),
    ("household", {"size": "small", "shuffle_actions": True}, "valid_unseen"),
    ("synthshop", {"split_sizes": {"train": 6}}, "train"),
])
def test_info_changes_no_episode(name, kwargs, split):
    """The household's episodes feed a running study: with info() called first, every observation, admissible list,
    reward, flag and info of the expert's episodes is what it was without it."""
    plain, asked = make_env(name, **kwargs), make_env(name, **kwargs)
    asked.info()
    tasks = plain.tasks(split)[:4]
    assert asked.tasks(split)[:4] == tasks
    for task in tasks:
        assert _expert_episode(asked, task) == _expert_episode(plain, task)


def test_synthshop_info():
    from interq import __version__

    env = make_env("synthshop", seed=2, catalog_seed=5, products_per_type=10,
                   split_sizes={"train": 40, "valid_seen": 5, "valid_unseen": 12})
    info = env.info()
    assert info["env"] == "synthshop" and "not WebShop's product data" in info["engine"]
    assert info["version"] == f"interq {__version__}" and info["source"] == "generated" and info["seed"] == 2
    assert info["catalog"] == {"seed": 5, "products_per_type": 10, "products": len(env.catalog.products),
                               "categories": 5, "product_types": 30}
    assert len(info["unseen_product_types"]) == 5
    assert (info["max_steps"], info["success_reward"]) == (15, 10.0)
    _check_splits(info, env, ("train", "valid_seen", "valid_unseen"))
    assert info["split_sizes"] == {"train": 40, "valid_seen": 5, "valid_unseen": 12}
    unseen_goals = [env.goal(t) for t in env.tasks("valid_unseen")]
    assert all(g.type in info["unseen_product_types"] for g in unseen_goals)


@pytest.mark.scienceworld
def test_scienceworld_info():
    pytest.importorskip("scienceworld", reason="could not import 'scienceworld' (extra interq[scienceworld])")
    if shutil.which("java") is None:
        pytest.skip("ScienceWorld needs java on PATH")
    from importlib.metadata import version

    names = ["find-non-living-thing", "boil"]
    env = make_env("scienceworld", task_names=names, max_variations=3)
    try:
        info = env.info()
        assert info["env"] == "scienceworld" and info["engine"] == "ScienceWorld"
        assert info["version"] == f"scienceworld {version('scienceworld')}"
        assert info["java"]["version"][0].isdigit() and 0 < info["java"]["max_heap_mib"] <= 1024  # the capped heap
        assert info["task_names"] == names and info["max_variations"] == 3 and info["simplification"] == "easy"
        assert (info["max_steps"], info["reward_scale"], info["admissible"]) == (100, 1.0, False)
        _check_splits(info, env, ("train", "dev", "test"))
        assert info["task_types"]["dev"] == {"find-non-living-thing": 3, "boil": 3}
        # the variations of each split are ScienceWorld's own (one load now lists all three splits)
        sw = env._sw
        sw.load("boil", 0, "easy", generateGoldPath=False)
        want = {"train": sw.get_variations_train(), "dev": sw.get_variations_dev(), "test": sw.get_variations_test()}
        for split, vs in want.items():
            assert env.variations("boil", split) == sorted(int(v) for v in vs)
        task = env.tasks("train")[0]
        obs = env.reset(task)  # an episode after info() starts as usual
        assert obs.task.task_id == task.task_id and env.expert_action() is not None
    finally:
        env.close()
