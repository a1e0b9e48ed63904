"""household: generator, ALFWorld text and rules, expert, episode contract, bad input."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from interq.envs.base import Env, EpisodeError, UnknownTaskError
from interq.envs.household import (
    TASK_TYPES,
    GoalSpec,
    HouseholdEnv,
    HouseholdWorld,
    ObjectSpec,
    ReceptacleSpec,
    build_env,
    generate_world,
)
from interq.envs.household.generator import is_unseen_scene, scene_layout
from interq.envs.household.world import object_properties


def _rec(name, openable=False):
    t, n = name.rsplit(" ", 1)
    return ReceptacleSpec(name=name, type=t, number=int(n), openable=openable, opened=False)


def _obj(name, parent):
    t, n = name.rsplit(" ", 1)
    return ObjectSpec(name=name, type=t, number=int(n), parent=parent, **object_properties(t))


def kitchen_world(task_type="pick_heat_then_place", text="put a hot apple in countertop."):
    return HouseholdWorld(
        task_id="hand-0", split="train", seed=0, room="kitchen", scene=7,
        receptacles=(_rec("cabinet 1", True), _rec("cabinet 2", True), _rec("countertop 1"), _rec("fridge 1", True),
                     _rec("microwave 1", True), _rec("sinkbasin 1")),
        objects=(_obj("apple 1", "fridge 1"), _obj("apple 2", "cabinet 2"), _obj("knife 1", "countertop 1"),
                 _obj("mug 1", "countertop 1")),
        goal=GoalSpec(task_type=task_type, object_type="apple", receptacle_type="countertop", toggle_type=None,
                      mrecep_type=None, object_sliced=False, text=text),
    )


def play_expert(env, spec):
    obs = env.reset(spec)
    while True:
        a = env.expert_action()
        assert a is not None and a in obs.admissible_actions, (a, spec)
        r = env.step(a)
        obs = r.observation
        if r.terminated or r.truncated:
            return r


def test_protocol_and_determinism():
    env = HouseholdEnv(split_sizes={"train": 12})
    assert isinstance(env, Env)
    assert generate_world("train", 5, seed=3) == generate_world("train", 5, seed=3)
    assert generate_world("train", 5, seed=3) != generate_world("train", 5, seed=4)
    specs = env.tasks("train")
    assert [s.task_id for s in specs] == [f"train-{i:05d}" for i in range(12)]
    assert [s.task_type for s in specs] == list(TASK_TYPES) * 2        # balanced round-robin
    assert specs == HouseholdEnv(split_sizes={"train": 12}).tasks("train")   # stable ids and goals
    assert all(s.description.endswith(".") and s.env == "household" for s in specs)


def test_splits_disjoint():
    env = HouseholdEnv(split_sizes={"train": 120, "valid_seen": 60, "valid_unseen": 60})
    worlds = {sp: [env.world(t) for t in env.tasks(sp)] for sp in ("train", "valid_seen", "valid_unseen")}
    train_scenes = {w.scene for w in worlds["train"]}
    unseen_scenes = {w.scene for w in worlds["valid_unseen"]}
    assert not train_scenes & unseen_scenes
    assert all(is_unseen_scene(s) for s in unseen_scenes) and not any(is_unseen_scene(s) for s in train_scenes)
    assert {w.scene for w in worlds["valid_seen"]} <= {s for s in range(1, 431) if not is_unseen_scene(s)}
    assert not {(w.receptacles, w.objects, w.goal) for w in worlds["train"]} & \
        {(w.receptacles, w.objects, w.goal) for w in worlds["valid_seen"]}
    # a scene fixes its receptacles
    assert scene_layout(12) == scene_layout(12)
    for w in worlds["train"][:30]:
        names = {r.name for r in w.receptacles}
        assert all(o.parent in names for o in w.objects)


@pytest.mark.parametrize("expert", ["explore", "omniscient"])
def test_expert_solves_every_type(expert):
    env = HouseholdEnv(split_sizes={"train": 60, "valid_seen": 24, "valid_unseen": 24}, expert=expert)
    for split in ("train", "valid_seen", "valid_unseen"):
        for spec in env.tasks(split):
            r = play_expert(env, spec)
            assert r.terminated and not r.truncated and r.info["won"] and r.reward == 10.0, spec
            assert env.expert_action() is None


def test_not_solved_at_start_and_expert_recovers_from_noise():
    env = HouseholdEnv(split_sizes={"train": 60})
    rng = random.Random(0)
    for spec in env.tasks("train"):
        env.reset(spec)
        assert not env.game.won()
        obs = env.reset(spec)
        for _ in range(50):
            a = rng.choice(obs.admissible_actions) if rng.random() < 0.3 else env.expert_action()
            r = env.step(a)
            obs = r.observation
            if r.terminated or r.truncated:
                break
        assert r.terminated or r.truncated


def test_alfworld_text():
    env = build_env(kitchen_world())
    obs = env.reset(env.tasks("train")[0])
    assert obs.text == ("You are in the middle of a room. Looking quickly around you, you see a cabinet 2, a cabinet 1, "
                        "a countertop 1, a fridge 1, a microwave 1, and a sinkbasin 1.\n\n"
                        "Your task is to: put a hot apple in countertop.")
    assert obs.anchor == obs.text
    assert "help" not in obs.admissible_actions and "go to fridge 1" in obs.admissible_actions
    steps = [
        ("go to fridge 1", "You arrive at fridge 1. The fridge 1 is closed."),
        ("open fridge 1", "You open the fridge 1. The fridge 1 is open. In it, you see a apple 1."),
        ("take apple 1 from fridge 1", "You pick up the apple 1 from the fridge 1."),
        ("inventory", "You are carrying: a apple 1."),
        ("examine apple 1", "There's nothing special about apple 1."),
        ("look", "You are facing the fridge 1. Next to it, you see nothing."),
        ("cool apple 1 with fridge 1", "You cool the apple 1 using the fridge 1."),
        ("examine apple 1", "This is a cold apple 1."),
        ("close fridge 1", "You close the fridge 1."),
        ("go to sinkbasin 1", "You arrive at sinkbasin 1. On the sinkbasin 1, you see nothing."),
        ("clean apple 1 with sinkbasin 1", "You clean the apple 1 using the sinkbasin 1."),
        (env.parse_action("<action>  Go To   Microwave 1 </action>").action,
         "You arrive at microwave 1. The microwave 1 is closed."),
        ("heat apple 1 with microwave 1", "You heat the apple 1 using the microwave 1."),
        ("examine apple 1", "This is a hot and clean apple 1."),
        ("go to countertop 1", "You arrive at countertop 1. On the countertop 1, you see a knife 1, and a mug 1."),
    ]
    for action, text in steps:
        r = env.step(action)
        assert r.observation.text == text, action
        assert r.info["valid_action"] and not r.terminated
    assert "take mug 1 from countertop 1" not in r.observation.admissible_actions   # hands full
    assert "go to countertop 1" not in r.observation.admissible_actions              # already there
    assert "examine mug 1" not in r.observation.admissible_actions                   # only held objects
    assert env.game._examine_object("mug 1") == "This is a normal mug 1. In it, you see nothing."
    assert env.step("Move apple 1 to countertop 1").observation.text == "Nothing happens."   # exact, like TextWorld
    r = env.step("move apple 1 to countertop 1")
    assert r.observation.text == "You move the apple 1 to the countertop 1."
    assert r.terminated and r.info["won"] and r.reward == 10.0 and not r.truncated


def test_slice_and_lamp():
    env = build_env(kitchen_world(task_type="pick_and_place", text="put a apple in countertop."))
    env.reset("hand-0")
    env.step("go to countertop 1")
    env.step("take knife 1 from countertop 1")
    r = env.step("go to cabinet 2")
    assert "slice apple 2 with knife 1" in r.observation.admissible_actions  # objectAtLocation, closed or not
    assert env.step("slice apple 2 with knife 1").observation.text == "You sliced the apple 2 with the knife 1."
    w = HouseholdWorld(
        task_id="lamp-0", split="valid_unseen", seed=0, room="bedroom", scene=301,
        receptacles=(_rec("bed 1"), _rec("sidetable 1")),
        objects=(_obj("book 1", "bed 1"), _obj("desklamp 1", "sidetable 1")),
        goal=GoalSpec("look_at_obj_in_light", "book", None, "desklamp", None, False, "examine the book with the desklamp."))
    env = build_env(w)
    env.reset(env.tasks("valid_unseen")[0])
    assert env.step("go to sidetable 1").observation.text == "You arrive at sidetable 1. On the sidetable 1, you see a desklamp 1."
    assert "take desklamp 1 from sidetable 1" not in env.admissible_actions()
    assert env.step("examine desklamp 1").observation.text == "Nothing happens."     # not held
    r = env.step("use desklamp 1")
    assert r.observation.text == "You turn on the desklamp 1." and not r.terminated
    env.step("go to bed 1")
    env.step("take book 1 from bed 1")
    r = env.step("go to sidetable 1")
    assert r.terminated and r.info["won"]


def test_bad_input_and_episode_contract():
    env = HouseholdEnv(split_sizes={"train": 6}, max_steps=4)
    with pytest.raises(EpisodeError):
        env.step("look")
    spec = env.tasks("train")[0]
    obs = env.reset(spec)
    for bad in ["", "x" * 100_000, "go to nowhere 9", "take apple 1 from fridge 1"]:
        before = env.admissible_actions()
        r = env.step(bad)
        assert r.observation.text == "Nothing happens." and r.info["valid_action"] is False and r.reward == 0.0
        assert env.admissible_actions() == before
    assert r.truncated and not r.terminated and r.info["step"] == 4 and not r.info["won"]
    with pytest.raises(EpisodeError, match="ended"):
        env.step("look")
    with pytest.raises(TypeError):
        env.reset(spec) and env.step(None)
    for bad_task in ["train-00006", "nope", "test-00001"]:
        with pytest.raises(UnknownTaskError):
            env.reset(bad_task)
    with pytest.raises(UnknownTaskError):
        env.reset(spec.__class__(env="alfworld", task_id="train-00000", split="train"))
    with pytest.raises(ValueError, match="split"):
        env.tasks("test")
    with pytest.raises(ValueError, match="expert"):
        HouseholdEnv(expert="oracle")
    assert obs.task == spec


def test_parse_action():
    env = HouseholdEnv(split_sizes={"train": 1})
    def p(text):
        r = env.parse_action(text)
        return (r.action, r.valid)
    assert p("think...<action>go to a</action> then <ACTION> Go To  Fridge 1 </Action>") == ("go to fridge 1", True)
    assert p("go to fridge 1") == ("go to fridge 1", True)
    assert p("") == ("", False) and p(None) == ("", False) and p("   \n") == ("", False)
    assert p("<action></action>")[1] is False
    a = env.parse_action("I think\nwe should\ngo to fridge 1")
    assert a.valid is False and a.action == "go to fridge 1"
    big = env.parse_action("<action>" * 12_000 + "x" * 100_000)
    assert big.valid is False and len(big.action) <= 200
    assert p("y" * 50_000 + "<action>look</action>") == ("look", True)


def test_world_roundtrip_and_build_env():
    w = generate_world("valid_seen", 7)
    assert HouseholdWorld.from_dict(w.to_dict()) == w
    env = build_env(w, max_steps=50)
    assert [t.task_id for t in env.tasks("valid_seen")] == [w.task_id]
    assert play_expert(env, env.tasks("valid_seen")[0]).info["won"]
    assert w.can_contain_facts() and all(isinstance(x, tuple) for x in w.can_contain_facts())


@settings(max_examples=30, deadline=None)
@given(index=st.integers(0, 200), picks=st.lists(st.integers(0, 10_000), min_size=1, max_size=40))
def test_random_admissible_walks(index, picks):
    env = HouseholdEnv(split_sizes={"train": 201})
    obs = env.reset(env.tasks("train")[index])
    for k in picks:
        a = obs.admissible_actions[k % len(obs.admissible_actions)]
        r = env.step(a)
        assert r.info["valid_action"], a
        assert r.reward == (10.0 if r.info["won"] else 0.0)
        obs = r.observation
        if r.terminated or r.truncated:
            break
        e = env.expert_action()
        assert e in obs.admissible_actions


def test_small_rooms_and_task_list_fast_path():
    env = HouseholdEnv(size="small", split_sizes={"train": 24, "valid_seen": 6, "valid_unseen": 12})
    full = HouseholdEnv(split_sizes={"train": 24})
    for spec in env.tasks("train") + env.tasks("valid_unseen"):
        w = env.world(spec)
        assert w.goal.text == spec.description and w.goal.task_type == spec.task_type
        counts = {}
        for r in w.receptacles:
            counts[r.type] = counts.get(r.type, 0) + 1
        assert max(counts.values()) <= 2
        assert play_expert(env, spec).info["won"]
    assert [env.world(s) for s in env.tasks("train")] != [full.world(s) for s in full.tasks("train")]
    assert [s.description for s in full.tasks("train")] == [full.world(s).goal.text for s in full.tasks("train")]
    with pytest.raises(ValueError, match="size"):
        HouseholdEnv(size="huge")


def test_shuffle_actions_is_a_fixed_permutation_per_state_and_changes_nothing_else():
    from interq.envs.household import HouseholdEnv

    plain = HouseholdEnv(size="small")
    shuffled = HouseholdEnv(size="small", shuffle_actions=True)
    task = plain.tasks("train")[0]
    o1, o2 = plain.reset(task), shuffled.reset(task)
    moved = 0
    for _ in range(8):
        a = plain.expert_action()
        assert a == shuffled.expert_action()
        assert sorted(o1.admissible_actions) == sorted(o2.admissible_actions)
        moved += o1.admissible_actions != o2.admissible_actions
        # the same state lists its actions in the same order (a replay, GiGPO's anchors)
        assert shuffled.admissible_actions() == o2.admissible_actions
        r1, r2 = plain.step(a), shuffled.step(a)
        assert (r1.observation.text, r1.reward, r1.terminated) == (r2.observation.text, r2.reward, r2.terminated)
        o1, o2 = r1.observation, r2.observation
        if r1.terminated:
            break
    assert moved >= 2  # the order really changes
    again = HouseholdEnv(size="small", shuffle_actions=True)
    assert again.reset(task).admissible_actions == shuffled.reset(task).admissible_actions
    with pytest.raises(ValueError, match="shuffle_actions"):
        HouseholdEnv(shuffle_actions="yes")
