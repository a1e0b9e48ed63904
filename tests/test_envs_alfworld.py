"""ALFWorld adapter, offline game generator, household exporter and fidelity check.

Tests marked ``alfworld`` need the extra (``scripts/setup.sh alfworld``) and skip without it.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from interq.envs.base import EpisodeError, TaskSpec, UnknownTaskError


def test_adapters_import_without_engines():
    code = ("import sys, interq.envs.alfworld, interq.envs.scienceworld, interq.envs.webshop\n"
            "bad = [m for m in ('alfworld', 'textworld', 'scienceworld', 'py4j', 'web_agent_site') if m in sys.modules]\n"
            "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_mangle_and_expert_view():
    from interq.envs.alfworld.env import _expert_view
    from interq.envs.alfworld.export import loc_name, mangle

    assert mangle("Apple|+00.10|-01.25|+00.00") == "Apple_bar__plus_00_dot_10_bar__minus_01_dot_25_bar__plus_00_dot_00"
    assert loc_name((1, -3, 0, 30)) == "loc_bar_1_bar__minus_3_bar_0_bar_30"
    assert _expert_view("move apple 1 to fridge 1") == "put apple 1 in fridge 1"
    assert _expert_view("go to fridge 1") == "go to fridge 1"


def test_missing_engine_error(monkeypatch):
    from interq._optional import MissingDependency
    from interq.envs.alfworld import AlfworldEnv

    monkeypatch.setitem(sys.modules, "alfworld", None)
    with pytest.raises(MissingDependency, match="setup.sh alfworld"):
        AlfworldEnv()


alfworld_mark = pytest.mark.alfworld


@pytest.fixture(scope="module")
def aw():
    pytest.importorskip("alfworld")
    pytest.importorskip("textworld")
    return None


@pytest.fixture(scope="module")
def gen_env(aw, tmp_path_factory):
    from interq.envs import make_env

    env = make_env("alfworld", source="generated", cache_dir=str(tmp_path_factory.mktemp("awgames")),
                   split_sizes={"train": 12, "valid_seen": 6, "valid_unseen": 6})
    yield env
    env.close()


@alfworld_mark
def test_layout_generator_deterministic_balanced_and_split(aw):
    from interq.envs.alfworld.layouts import available_scenes, layout_world, split_scenes
    from interq.envs.household.generator import is_unseen_scene
    from interq.envs.household.world import TASK_TYPES, can_contain

    assert len(available_scenes()) >= 100
    a = layout_world("train", 7, seed=3)
    assert a == layout_world("train", 7, seed=3)
    assert a[0] != layout_world("valid_seen", 7, seed=3)[0]
    types = [layout_world("train", i)[0].task_type for i in range(6)]
    assert types == list(TASK_TYPES)
    for i in range(12):
        w, places, agent = layout_world("valid_unseen", i)
        assert is_unseen_scene(w.scene)
        assert agent not in {p.point for p in places.values()}
        for o in w.objects:
            assert can_contain(w.receptacle(o.parent).type, o.type) or o.toggleable
            if o.type == w.goal.object_type and w.goal.receptacle_type:
                assert w.receptacle(o.parent).type != w.goal.receptacle_type
    for room in ("kitchen", "livingroom", "bedroom", "bathroom"):
        assert not set(split_scenes("train", room)) & set(split_scenes("valid_unseen", room))


@alfworld_mark
def test_generated_games_all_six_types_solved_by_alfworld_expert(gen_env):
    from interq.envs.household.world import TASK_TYPES

    tasks = gen_env.tasks("train")[:6]
    assert [t.task_type for t in tasks] == list(TASK_TYPES)
    for t in tasks:
        obs = gen_env.reset(t)
        world = gen_env._generated("train", int(t.task_id.split("-")[1]))[0]
        # the engine names every receptacle exactly as the generated world does
        listed = obs.text.split("you see ", 1)[1].split("\n")[0]
        for r in world.receptacles:
            assert f"a {r.name}," in listed or f"a {r.name}." in listed, (r.name, listed)
        assert obs.text.endswith(f"Your task is to: {t.description}")
        assert "help" not in obs.admissible_actions and obs.anchor == obs.text
        for _ in range(gen_env.max_steps):
            res = gen_env.step(gen_env.expert_action())
            if res.terminated or res.truncated:
                break
        assert res.terminated and res.info["won"] and res.reward == 10.0, (t, res.info)
        assert gen_env.expert_action() is None


@alfworld_mark
def test_bad_input(gen_env):
    env = gen_env
    with pytest.raises(UnknownTaskError):
        env.reset("train-99999")
    with pytest.raises(UnknownTaskError):
        env.reset("nonsense")
    with pytest.raises(UnknownTaskError):
        env.reset(TaskSpec("household", "train-00000", "train"))
    with pytest.raises(UnknownTaskError):
        env.reset(TaskSpec("alfworld", "train-00000", "valid_seen"))
    with pytest.raises(TypeError):
        env.reset(3)
    with pytest.raises(ValueError, match="split"):
        env.tasks("test")
    env.reset("train-00000")
    for bad in ("", "x" * 100_000, "go to the moon", "  \n "):
        res = env.step(bad)
        assert res.observation.text == "Nothing happens."
        assert res.info["valid_action"] is False and not res.terminated and not res.truncated
    with pytest.raises(TypeError):
        env.step(None)
    assert env.parse_action("<action>Go To  Fridge 1</action>").action == "go to fridge 1"
    assert env.parse_action("x" * 100_000).valid is False
    # truncation, then stepping after the end is a programming mistake
    from interq.envs.alfworld import AlfworldEnv

    short = AlfworldEnv(source="generated", cache_dir=str(env.cache_dir), split_sizes=env.split_sizes, max_steps=3,
                        expert=False)
    short.reset("train-00000")
    results = [short.step("look") for _ in range(3)]
    assert [r.truncated for r in results] == [False, False, True] and not any(r.terminated for r in results)
    with pytest.raises(EpisodeError):
        short.step("look")
    short.close()


@alfworld_mark
def test_constructor_errors(aw, monkeypatch, tmp_path):
    from interq.envs.alfworld import AlfworldEnv

    with pytest.raises(ValueError, match="source"):
        AlfworldEnv(source="web")
    with pytest.raises(ValueError, match="max_steps"):
        AlfworldEnv(max_steps=0)
    with pytest.raises(ValueError, match="split_sizes"):
        AlfworldEnv(split_sizes={"test": 3})
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError, match="ALFWORLD_DATA"):
        AlfworldEnv(source="official")
    assert AlfworldEnv(source="auto", cache_dir=str(tmp_path)).source == "generated"
    with pytest.raises(EpisodeError):
        AlfworldEnv(cache_dir=str(tmp_path)).step("look")


@alfworld_mark
def test_auto_source_choice_is_said_and_recorded(aw, monkeypatch, tmp_path, capsys):
    """source='auto' says (stderr, one line, once per process) which source it chose and why; info() records it and
    the trainer's split_tasks hands it to the run."""
    from interq.envs.alfworld import AlfworldEnv, env as aw_env
    from interq.train.build import split_tasks
    from interq.train.config import EnvConfig

    monkeypatch.setattr(aw_env, "_SAID", set())
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path / "missing"))
    env = AlfworldEnv(cache_dir=str(tmp_path), split_sizes={"train": 2, "valid_seen": 1, "valid_unseen": 1})
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("interq: alfworld: source='auto' chose 'generated'"), err
    assert "ALFWORLD_DATA" in err[0] and "missing" in err[0]
    info = env.info()
    assert info["source"] == "generated" and "chose 'generated'" in info["source_reason"]
    AlfworldEnv(cache_dir=str(tmp_path))
    assert capsys.readouterr().err == ""  # once per process, not once per env (workers build many)
    assert AlfworldEnv(source="generated", cache_dir=str(tmp_path)).info()["source_reason"] == "source='generated'"
    recorded: dict = {}
    split_tasks(lambda: AlfworldEnv(cache_dir=str(tmp_path), split_sizes={"train": 2, "valid_seen": 1,
                                                                         "valid_unseen": 1}),
                EnvConfig(name="alfworld", num_train_tasks=2, num_eval_tasks=1), recorded)
    assert recorded["source"] == "generated" and recorded["env"] == "alfworld"


@alfworld_mark
def test_official_games_layout(aw, monkeypatch, tmp_path):
    """ALFWORLD_DATA with the standard layout: solvable games listed per split, movable/sliced skipped."""
    from interq.envs.alfworld import AlfworldEnv
    from interq.envs.alfworld.export import write_game
    from interq.envs.alfworld.layouts import layout_world

    root = tmp_path / "data"
    w, places, agent = layout_world("valid_seen", 0)
    trial = root / "json_2.1.1/valid_seen/pick_and_place_simple-SaltShaker-None-Cabinet-7/trial_T1"
    write_game(w, trial, places, agent)
    write_game(w, root / "json_2.1.1/valid_seen/pick_and_place_with_movable_recep-A-B-C-1/trial_T2", places, agent)
    unsolvable = root / "json_2.1.1/valid_seen/pick_and_place_simple-X-None-Y-2/trial_T3"
    write_game(w, unsolvable, places, agent)
    g = json.loads((unsolvable / "game.tw-pddl").read_text())
    g["solvable"] = False
    (unsolvable / "game.tw-pddl").write_text(json.dumps(g))
    monkeypatch.setenv("ALFWORLD_DATA", str(root))
    env = AlfworldEnv(cache_dir=str(tmp_path / "cache"))
    assert env.source == "official"
    assert env.info()["source"] == "official" and env.info()["data_path"] == str(root)
    assert "chose 'official'" in env.info()["source_reason"]
    tasks = env.tasks("valid_seen")
    assert [t.task_id for t in tasks] == ["pick_and_place_simple-SaltShaker-None-Cabinet-7/trial_T1"]
    assert tasks[0].task_type == "pick_and_place"
    assert env.tasks("train") == []
    obs = env.reset(tasks[0])
    assert obs.text.startswith("You are in the middle of a room.") and obs.task.description == w.goal.text
    with pytest.raises(UnknownTaskError):
        env.reset("pick_and_place_with_movable_recep-A-B-C-1/trial_T2")
    env.close()


@alfworld_mark
def test_fidelity_household_vs_alfworld_one_task_per_type(aw, tmp_path):
    from interq.envs.alfworld.fidelity import check_world, fidelity_worlds

    for world in fidelity_worlds(per_type=1, seed=11, size="small"):
        rec = check_world(world, str(tmp_path))
        assert rec.household_won and rec.alfworld_won, rec
        assert rec.states_agree == rec.states and rec.text_agree == rec.states, rec.disagreements[:3]


@alfworld_mark
def test_speedup_same_output(aw, tmp_path):
    from interq.envs.alfworld import AlfworldEnv, speedup
    from interq.envs.household import HouseholdEnv, generate_world

    world = generate_world("train", 0, seed=5, task_type="pick_clean_then_place")
    hh = HouseholdEnv(worlds=[world], expert="omniscient")
    hh.reset(world.task_id)
    plan = []
    while (a := hh.expert_action()) is not None:
        plan.append(a)
        hh.step(a)
    plan += ["", "inventory"]

    def play(fast: bool):
        speedup.uninstall()
        env = AlfworldEnv(worlds=[world], cache_dir=str(tmp_path), expert=False, fast=fast, max_steps=100)
        out = [env.reset(world.task_id)]
        out += [env.step(a).observation for a in plan if not env._done]
        env.close()
        return out

    try:
        slow, fast = play(False), play(True)
    finally:
        speedup.install()
    assert [(o.text, o.admissible_actions) for o in slow] == [(o.text, o.admissible_actions) for o in fast]
