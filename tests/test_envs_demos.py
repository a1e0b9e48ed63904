"""Expert demonstrations: recording, noise, JSONL round trip, SFT pairs, prompts."""

from __future__ import annotations

import json

import pytest

from interq.envs import make_env
from interq.envs.demos import Demo, generate_demos, read_demos, record_demo, sft_pairs, summarize, write_demos
from interq.envs.prompting import build_prompt, format_action


def _env():
    return make_env("household", split_sizes={"train": 24, "valid_seen": 6, "valid_unseen": 6})


def test_clean_demos_succeed_and_round_trip(tmp_path):
    env = _env()
    demos = list(generate_demos(env, env.tasks("train"), noise=0.0, seed=1))
    s = summarize(demos)
    assert s["episodes"] == 24 and s["success_rate"] == 1.0 and s["noisy_frac"] == 0.0
    for d in demos:
        assert len(d.observations) == len(d.actions) + 1 == len(d.admissible_actions)
        assert d.actions == d.expert_actions and d.won and d.terminated and not d.truncated
        assert d.episode_return == 10.0 and d.rewards[-1] == 10.0
    path = tmp_path / "sub" / "demos.jsonl"
    assert write_demos(path, demos) == 24
    back = read_demos(path)
    assert back == demos
    line = json.loads(path.read_text().splitlines()[0])
    assert set(line) >= {"env", "task_id", "task", "observations", "actions", "outcome"}
    assert line["outcome"]["won"] is True and line["outcome"]["length"] == len(line["actions"])


def test_noise_is_deterministic_and_makes_detours():
    env = _env()
    tasks = env.tasks("train")[:12]
    a = list(generate_demos(env, tasks, noise=0.3, seed=7))
    b = list(generate_demos(env, tasks, noise=0.3, seed=7))
    assert a == b
    clean = list(generate_demos(env, tasks, noise=0.0))
    s = summarize(a)
    assert 0.15 < s["noisy_frac"] < 0.5
    assert s["mean_length"] > summarize(clean)["mean_length"]
    for d in a:
        for act, exp, noisy, adm in zip(d.actions, d.expert_actions, d.noisy, d.admissible_actions):
            assert act in adm
            assert (act != exp) == noisy
    all_noise = record_demo(env, tasks[0], noise=1.0, seed=0)
    assert all(all_noise.noisy) and all_noise.length <= env.max_steps
    with pytest.raises(ValueError, match="noise"):
        record_demo(env, tasks[0], noise=1.5)


def test_sft_pairs_and_prompt():
    env = _env()
    d = record_demo(env, env.tasks("train")[3], noise=0.5, seed=3)
    pairs = sft_pairs(d, history_length=2)
    assert len(pairs) == d.length
    prompt, target = pairs[0]
    assert target == format_action(d.actions[0]) == f"<action>{d.actions[0]}</action>"
    assert env.parse_action(target).action == d.actions[0]
    assert d.task in prompt and d.observations[0] in prompt and "<action> </action>" in prompt
    assert "admissible actions" in prompt
    if d.length > 3:
        p3 = pairs[3][0]
        assert "already taken 3 step(s)" in p3 and f"Action 3: '{d.actions[2]}'" in p3
        assert f"Action 1: '{d.actions[0]}'" not in p3          # only the last 2 pairs
    only_expert = sft_pairs(d, include_noisy=False)
    assert len(only_expert) == d.length - sum(d.noisy)
    p = build_prompt("shop for socks", "page", None, env_name="synthshop", think=True)
    assert "admissible" not in p and "<think>" in p and "Your task is to: shop for socks" in p
    with pytest.raises(ValueError):
        build_prompt("t", "o", [], history_length=-1)


def test_bad_demo_file(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text('{"env": "household"}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        read_demos(p)
    p.write_text("not json\n")
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        read_demos(p)


def test_env_without_expert():
    class NoExpert:
        name = "x"
    with pytest.raises(TypeError, match="expert_action"):
        record_demo(NoExpert(), None)
    assert Demo.__dataclass_fields__["noise"].default == 0.0


def test_demos_are_env_agnostic(tmp_path):
    shop = make_env("synthshop", split_sizes={"train": 8})
    clean = list(generate_demos(shop, shop.tasks("train")))
    assert summarize(clean)["success_rate"] == 1.0
    noisy = list(generate_demos(shop, shop.tasks("train"), noise=0.5, seed=2))
    assert summarize(noisy)["noisy_frac"] > 0
    write_demos(tmp_path / "shop.jsonl", noisy)
    assert read_demos(tmp_path / "shop.jsonl") == noisy
    prompt, target = sft_pairs(clean[0])[0]
    assert "online shop" in prompt and target.startswith("<action>search[")


class _ScriptedExpert:
    """A three-step env whose expert follows ``script`` (None: no action; any text: offered as it is)."""

    name = "scripted"

    def __init__(self, script):
        self.script, self.stepped = list(script), []

    def _obs(self):
        from interq.envs.base import Observation

        return Observation(f"room {len(self.stepped)}", ("go north", "go south"))

    def reset(self, task):
        self.stepped = []
        return self._obs()

    def expert_action(self):
        return self.script[len(self.stepped)]

    def step(self, action):
        from interq.envs.base import StepResult

        if not isinstance(action, str):
            raise TypeError(f"stepped with {action!r}")
        self.stepped.append(action)
        done = len(self.stepped) == 3
        return StepResult(self._obs(), 10.0 if done else 0.0, done, False, {"won": done})

    def close(self):
        pass


def _collect(env, by_index, num_demos=1):
    from interq.envs.base import TaskSpec
    from interq.train.build import collect_demos

    task = TaskSpec("scripted", "t0", "train", "walk", "walk")
    return collect_demos(lambda: env, [task], num_demos, 0.0, 0, max_turns=5, by_index=by_index)


def test_collect_demos_stops_where_the_expert_has_no_action():
    env = _ScriptedExpert(["go north", None, "go north"])
    [demo] = _collect(env, by_index=False)
    assert env.stepped == ["go north"]  # None is never stepped
    assert demo.actions == ["go north"] and len(demo.observations) == 1 and not demo.won
    assert "no action" in demo.stopped
    with pytest.raises(RuntimeError, match="no expert demonstration"):  # not one turn anywhere: said, not trained on
        _collect(_ScriptedExpert([None]), by_index=False, num_demos=2)


def test_index_demos_never_write_text_where_a_number_is_expected():
    env = _ScriptedExpert(["go south", "jump", "go north"])  # "jump" is not admissible: it has no number
    [demo] = _collect(env, by_index=True)
    assert demo.actions == ["2"] and len(demo.observations) == 1
    assert all(a.isdigit() for a in demo.actions)
    assert env.stepped == ["go south"] and "'jump' is not in the admissible list" in demo.stopped
    [full] = _collect(_ScriptedExpert(["go south", "go north", "go north"]), by_index=True)
    assert full.actions == ["2", "1", "1"] and full.won and full.stopped == ""
    [text] = _collect(_ScriptedExpert(["go south", "jump", "go north"]), by_index=False)
    assert text.actions == ["go south", "jump", "go north"]  # the text format writes what the expert did
