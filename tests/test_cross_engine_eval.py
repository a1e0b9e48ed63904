"""One policy on two engines (scripts/cross_engine_eval.py): the paired statistics against naive references, and a
small warm-started household policy played on the same instances in household and in the real ALFWorld engine:
every episode identical (observations read, actions taken, outcome)."""

from __future__ import annotations

import importlib.util
import itertools
import math
import random
import sys
from pathlib import Path

import pytest

_SPEC = importlib.util.spec_from_file_location(
    "cross_engine_eval", Path(__file__).resolve().parents[1] / "scripts" / "cross_engine_eval.py")
xe = importlib.util.module_from_spec(_SPEC)
sys.modules[_SPEC.name] = xe   # dataclasses look their module up there
_SPEC.loader.exec_module(xe)


def test_paired_difference_matches_a_loop_over_pairs():
    rng = random.Random(0)
    for n in (1, 2, 7, 50):
        a = [rng.random() < 0.4 for _ in range(n)]
        b = [rng.random() < 0.3 for _ in range(n)]
        ds = [int(x) - int(y) for x, y in zip(a, b)]
        mean = sum(ds) / n
        var = sum((d - mean) ** 2 for d in ds) / n          # population variance of the paired differences
        se = math.sqrt(var / n)
        d, (lo, hi) = xe.paired_diff(a, b)
        assert d == pytest.approx(mean, abs=1e-12)
        assert lo == pytest.approx(mean - 1.96 * se, abs=1e-12) and hi == pytest.approx(mean + 1.96 * se, abs=1e-12)
    assert xe.paired_diff([True, False], [True, False]) == (0.0, (0.0, 0.0))
    with pytest.raises(ValueError, match="same non-zero length"):
        xe.paired_diff([True], [True, False])


def test_wilson_interval_closed_form():
    # 0 of 10: upper bound z^2 / (n + z^2); k of n: the textbook formula
    assert xe.wilson(0, 10) == (0.0, pytest.approx(1.96 ** 2 / (10 + 1.96 ** 2)))
    for k, n in itertools.product((0, 3, 10), (10, 40)):
        z, p = 1.96, k / n
        c = (p + z * z / (2 * n)) / (1 + z * z / n)
        h = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
        lo, hi = xe.wilson(k, n)
        assert lo == pytest.approx(max(0, c - h)) and hi == pytest.approx(min(1, c + h))


def test_first_difference_names_where_two_episodes_part():
    from interq.agent.loop import Episode
    from interq.envs.base import TaskSpec

    t = TaskSpec("household", "valid_seen-00001", "valid_seen")
    h = Episode(task=t, group=0, seed=1, anchors=["a", "b", "c"], actions=["x", "y", "z"], rewards=[0, 0, 10],
                valid=[True] * 3, won=True, terminated=True)
    same = Episode(task=t, group=0, seed=1, anchors=["a", "b", "c"], actions=["x", "y", "z"], rewards=[0, 0, 10],
                   valid=[True] * 3, won=True, terminated=True)
    assert xe._first_difference(h, same) is None
    other_text = Episode(task=t, group=0, seed=1, anchors=["a", "B", "c"], actions=["x", "y", "z"], rewards=[0, 0, 10],
                         valid=[True] * 3, won=True, terminated=True)
    assert xe._first_difference(h, other_text) == {"task_id": t.task_id, "turn": 1, "what": "observation",
                                                   "household": "b", "alfworld": "B"}
    shorter = Episode(task=t, group=0, seed=1, anchors=["a", "b"], actions=["x", "q"], rewards=[0, 0], valid=[True] * 2)
    assert xe._first_difference(h, shorter)["what"] == "action" and xe._first_difference(h, shorter)["turn"] == 1
    lost = Episode(task=t, group=0, seed=1, anchors=["a", "b", "c"], actions=["x", "y", "z"], rewards=[0, 0, 0],
                   valid=[True] * 3, truncated=True)
    assert xe._first_difference(h, lost)["what"] == "outcome"


def test_settings_must_be_household(tmp_path):
    from interq.train.config import ConfigError

    with pytest.raises(ConfigError, match="env.name='toy'.*accepted: 'household'"):
        xe.load_settings(tmp_path, ["env.name=toy", "env.env_kwargs={}", "env.task_types="])
    with pytest.raises(ValueError, match="num_tasks must be a positive int"):
        xe.cross_engine_eval(tmp_path, num_tasks=0)


@pytest.mark.alfworld
@pytest.mark.slow
def test_a_warm_started_policy_plays_identical_episodes_in_both_engines(tmp_path):
    """Where both engines are deterministic given the actions and show the policy the same text and the same ordered
    admissible actions, the same seeds give the same episodes: the outcomes agree instance by instance."""
    pytest.importorskip("textworld")
    pytest.importorskip("alfworld.info")
    from interq.train.config import build_config
    from interq.train.experiments import STUDY_BASE_OVERRIDES
    from interq.train.pipeline import prepare_policy

    cfg = build_config("household", [*STUDY_BASE_OVERRIDES, "warm_start.num_demos=32", "warm_start.steps=40",
                                     "warm_start.episodes_per_microbatch=16", "env.num_eval_tasks=6",
                                     "train.eval_temperature=1.0"])
    policy, _ = prepare_policy(cfg, tmp_path / "policy", log=lambda *_: None)
    rep = xe.cross_engine_eval(policy, batch=3, cache_dir=tmp_path / "games")
    assert rep.tasks == 6 and rep.config.endswith("run_config.yaml") and rep.temperature == 1.0
    assert rep.trajectory_agree == 1.0 and rep.first_differences == [], rep.first_differences
    assert rep.household_outcomes == rep.alfworld_outcomes and rep.success_diff == 0.0 and rep.discordant == 0
    assert rep.household_invalid_frac == rep.alfworld_invalid_frac < 0.9   # the policy does act: not all invalid
    assert rep.mean_turns[0] == rep.mean_turns[1] > 1


@pytest.mark.alfworld
def test_shuffled_listing_is_the_same_in_both_engines(tmp_path):
    """household's shuffle_actions permutes the listed actions per task and state; the ALFWorld side lists them in
    the same permuted order (so an index answer names the same action), which the raw ALFWorld env does not."""
    pytest.importorskip("textworld")
    from interq.envs.alfworld import AlfworldEnv
    from interq.envs.household import HouseholdEnv

    hh = HouseholdEnv(split_sizes={"valid_seen": 4}, size="small", shuffle_actions=True, seed=3)
    worlds = [hh.world(t) for t in hh.tasks("valid_seen")]
    raw = AlfworldEnv(worlds=worlds, cache_dir=tmp_path, expert=False)
    listed = xe.ListedLikeHousehold(AlfworldEnv(worlds=worlds, cache_dir=tmp_path, expert=False), seed=3)
    differs = 0
    for w in worlds:
        h, r, a = hh.reset(w.task_id), raw.reset(w.task_id), listed.reset(w.task_id)
        rng = random.Random(w.task_id)
        for _ in range(6):
            assert a.admissible_actions == h.admissible_actions and a.text == h.text
            assert sorted(r.admissible_actions) == sorted(h.admissible_actions)
            differs += r.admissible_actions != h.admissible_actions
            act = rng.choice(h.admissible_actions)
            h, r, a = hh.step(act).observation, raw.step(act).observation, listed.step(act).observation
    assert differs > 0
