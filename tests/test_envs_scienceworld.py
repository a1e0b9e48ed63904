"""ScienceWorld adapter (real engine; marked ``scienceworld``, skipped without the extra or Java).

One JVM for the whole module (about 2 s to start, more on a loaded machine).
"""

from __future__ import annotations

import shutil
import sys

import pytest

from interq.envs.base import EpisodeError, TaskSpec, UnknownTaskError



def test_missing_engine_error(monkeypatch):
    from interq._optional import MissingDependency
    from interq.envs.scienceworld import ScienceWorldEnv

    monkeypatch.setitem(sys.modules, "scienceworld", None)
    with pytest.raises(MissingDependency, match="setup.sh scienceworld"):
        ScienceWorldEnv()


@pytest.fixture(scope="module")
def sw():
    pytest.importorskip("scienceworld")
    if shutil.which("java") is None:
        pytest.skip("Java is not installed")
    from interq.envs import make_env

    env = make_env("scienceworld", task_names=["find-living-thing", "boil"], max_variations=5)
    yield env
    env.close()


@pytest.mark.scienceworld
def test_splits_are_disjoint(sw):
    specs = {s: sw.tasks(s) for s in ("train", "dev", "test")}
    ids = {s: {t.task_id for t in v} for s, v in specs.items()}
    assert all(ids.values())
    assert not ids["train"] & ids["dev"] and not ids["train"] & ids["test"] and not ids["dev"] & ids["test"]
    assert {t.task_type for t in specs["train"]} == {"find-living-thing", "boil"}
    assert all(len([t for t in specs["dev"] if t.task_type == n]) <= 5 for n in ("boil", "find-living-thing"))
    with pytest.raises(ValueError, match="split"):
        sw.tasks("valid")


@pytest.mark.scienceworld
def test_gold_path_scores_100(sw):
    task = next(t for t in sw.tasks("train") if t.task_type == "find-living-thing")
    obs = sw.reset(task)
    assert "living thing" in obs.text and obs.admissible_actions is None and obs.task.description
    gold = sw.gold_actions()
    total, res = 0.0, None
    for a in gold:
        assert sw.expert_action() == a
        res = sw.step(a)
        total += res.reward
        if res.terminated or res.truncated:
            break
    assert res.terminated and res.info["won"] and res.info["score"] == 100
    assert sw.expert_action() is None
    assert total == pytest.approx(100 - sw_score_at_reset(sw, task))  # reward = change of score


def sw_score_at_reset(sw, task) -> int:
    sw.reset(task)
    return sw.score


@pytest.mark.scienceworld
def test_failure_ends_episode(sw):
    task = next(t for t in sw.tasks("train") if t.task_type == "find-living-thing")
    sw.reset(task)
    adm = sw.admissible_actions()
    assert "look around" in adm and len(adm) > 10
    res = sw.step("focus on agent")  # focusing on a wrong thing fails the task
    assert res.terminated and res.info["failed"] and res.info["score"] < 0 and not res.info["won"]
    assert res.reward < 0
    with pytest.raises(EpisodeError):
        sw.step("look around")


@pytest.mark.scienceworld
def test_bad_input(sw):
    with pytest.raises(UnknownTaskError):
        sw.reset("no-such-task:0")
    with pytest.raises(UnknownTaskError):
        sw.reset("boil")
    with pytest.raises(UnknownTaskError):
        sw.reset("boil:100000")
    with pytest.raises(UnknownTaskError):
        sw.reset(TaskSpec("alfworld", "boil:0", "train"))
    sw.reset("boil:0")
    for bad in ("", "x" * 100_000, "fly to the moon", " \n"):
        res = sw.step(bad)
        assert res.info["valid_action"] is False and not res.terminated
        assert res.observation.text.startswith("No known action matches that input.")
    with pytest.raises(TypeError):
        sw.step(7)
    assert sw.parse_action("<action>Look Around</action>").action == "look around"
    from interq.envs.scienceworld import ScienceWorldEnv

    with pytest.raises(ValueError, match="max_steps"):
        ScienceWorldEnv(max_steps=0)


@pytest.mark.scienceworld
def test_truncation(sw):
    sw.max_steps, old = 2, sw.max_steps
    try:
        sw.reset("boil:0")
        assert not sw.step("look around").truncated
        res = sw.step("look around")
        assert res.truncated and not res.terminated
        with pytest.raises(EpisodeError):
            sw.step("look around")
    finally:
        sw.max_steps = old


@pytest.mark.scienceworld
def test_jvm_heap_is_capped(sw):
    import os

    from interq.envs.scienceworld import DEFAULT_JAVA_OPTIONS

    pid = sw._sw._gateway.java_process.pid
    path = f"/proc/{pid}/environ"
    if not os.path.exists(path):
        pytest.skip("no /proc")
    env = open(path, "rb").read().split(b"\0")
    opts = [e for e in env if e.startswith(b"JAVA_TOOL_OPTIONS=")]
    if "JAVA_TOOL_OPTIONS" in os.environ:
        assert opts == [b"JAVA_TOOL_OPTIONS=" + os.environ["JAVA_TOOL_OPTIONS"].encode()]
    else:
        assert opts == [b"JAVA_TOOL_OPTIONS=" + DEFAULT_JAVA_OPTIONS.encode()]


@pytest.mark.scienceworld
def test_same_task_and_actions_give_the_same_text_in_a_second_jvm(sw):
    """ScienceWorld lists objects, and reads an ambiguous action, in identity-hash order; the default JVM options
    fix the hash, so a second JVM (a second env) replays a task word for word. The boil variations hold three
    wood cups that differ only in their paint: which one "pick up wood cup" takes is what the hash decided."""
    import os

    from interq.envs.scienceworld import ScienceWorldEnv

    if "JAVA_TOOL_OPTIONS" in os.environ:
        pytest.skip("JAVA_TOOL_OPTIONS is set: the env's own JVM options are not used")
    assert sw.fixed_identity_hash()
    actions = ("look around", "pick up wood cup", "inventory", "look around")

    def play(env):
        texts = []
        for task in ("boil:0", "boil:1", "boil:2"):
            texts.append(env.reset(task).text)
            texts += [env.step(a).observation.text for a in actions]
        return texts

    other = ScienceWorldEnv(expert=False)
    try:
        assert play(other) == play(sw)
    finally:
        other.close()
