"""synthshop: catalog, WebShop grammar and pages, reward formula, expert, splits, bad input."""

from __future__ import annotations

import pytest

from interq.envs import make_env
from interq.envs.base import Env, EpisodeError, UnknownTaskError
from interq.envs.synthshop import UNSEEN_TYPES, Product, ShopGoal, satisfies, shop_reward

SIZES = {"train": 60, "valid_seen": 20, "valid_unseen": 20}


@pytest.fixture(scope="module")
def env():
    return make_env("synthshop", split_sizes=SIZES)


def _goal(**kw):
    base = dict(task_id="t", split="train", target_asin="B0X", category="fashion", type="socks",
                attributes=("cotton", "stretch"), options=(("color", "red"), ("size", "large")), budget=20.0,
                instruction="")
    base.update(kw)
    return ShopGoal(**base)


def _product(**kw):
    base = dict(asin="B0X", category="fashion", type="socks", title="T", attributes=("cotton", "slim fit"),
                options=(("color", ("red", "black")), ("size", ("large",))), price=19.99, rating=4.0,
                description="", features=(), reviews=())
    base.update(kw)
    return Product(**base)


def test_reward_formula():
    g, p = _goal(), _product()
    # attrs 1/2 (cotton), options 2/2, price 1 -> 4/5
    assert shop_reward(p, {"color": "red", "size": "large"}, g) == pytest.approx(4 / 5)
    assert shop_reward(p, {"color": "black"}, g) == pytest.approx(2 / 5)
    assert shop_reward(_product(type="jeans"), {"color": "red", "size": "large"}, g) == pytest.approx(0.5 * 4 / 5)
    assert shop_reward(_product(category="home", type="rug"), {}, g) == pytest.approx(0.1 * 2 / 5)
    full = _product(attributes=("cotton", "stretch"))
    assert shop_reward(full, {"color": "red", "size": "large"}, g) == 1.0 and satisfies(full, g)
    assert shop_reward(_product(attributes=("cotton", "stretch"), price=25.0), {"color": "red", "size": "large"}, g) < 1
    assert not satisfies(p, g)


def test_expert_wins_every_split(env):
    assert isinstance(env, Env)
    for split in ("train", "valid_seen", "valid_unseen"):
        for spec in env.tasks(split):
            obs = env.reset(spec)
            assert spec.description in obs.text and obs.admissible_actions == ("search[<your query>]",)
            while True:
                a = env.expert_action()
                assert a.startswith("search[") or a in obs.admissible_actions
                r = env.step(a)
                obs = r.observation
                if r.terminated or r.truncated:
                    break
            assert r.terminated and r.info["won"] and r.reward == 10.0 and r.info["task_score"] == 1.0
            assert env.expert_action() is None


def test_splits(env):
    t = [env.goal(s) for s in env.tasks("train")]
    vs = [env.goal(s) for s in env.tasks("valid_seen")]
    vu = [env.goal(s) for s in env.tasks("valid_unseen")]
    assert not {g.target_asin for g in t} & {g.target_asin for g in vs}
    assert all(g.type in UNSEEN_TYPES for g in vu) and not any(g.type in UNSEEN_TYPES for g in t + vs)
    assert env.tasks("train") == make_env("synthshop", split_sizes=SIZES).tasks("train")   # deterministic


def test_pages_and_navigation(env):
    spec = env.tasks("train")[1]
    env.reset(spec)
    g = env.goal(spec)
    r = env.step(f"search[{g.type}]")
    text = r.observation.text
    assert text.startswith("Back to Search [SEP] Page 1 (Total results: ")
    assert "click[next >]" in r.observation.admissible_actions and "click[< prev]" not in r.observation.admissible_actions
    r = env.step("click[next >]")
    assert "Page 2" in r.observation.text and "click[< prev]" in r.observation.admissible_actions
    item = next(a for a in r.observation.admissible_actions if a.startswith("click[b0"))
    r = env.step(item.upper())                                  # case-insensitive
    assert r.info["valid_action"] and r.observation.text.endswith("Buy Now")
    assert {"click[description]", "click[features]", "click[reviews]", "click[buy now]"} <= set(r.observation.admissible_actions)
    r = env.step("click[features]")
    assert r.observation.admissible_actions == ("click[back to search]", "click[< prev]")
    assert env.step("click[< prev]").observation.text.endswith("Buy Now")
    assert "Page 2" in env.step("click[< prev]").observation.text
    r = env.step("click[back to search]")
    assert r.observation.admissible_actions == ("search[<your query>]",)


def test_bad_input_and_limits():
    env = make_env("synthshop", split_sizes=SIZES, max_steps=4)
    with pytest.raises(EpisodeError):
        env.step("search[x]")
    obs = env.reset(env.tasks("train")[0])
    for bad in ["", "x" * 100_000, "click[buy now]", "search[]"]:
        r = env.step(bad)
        assert r.info["valid_action"] is False and r.observation.text == obs.text and r.reward == 0.0
    assert r.truncated and not r.terminated
    with pytest.raises(EpisodeError):
        env.step("search[x]")
    with pytest.raises(UnknownTaskError):
        env.reset("train-99999")
    with pytest.raises(UnknownTaskError):
        env.reset("household-1")
    assert env.parse_action("ok <action>Search[Red Socks]</action>").action == "search[red socks]"


def test_buy_wrong_thing_terminates_without_success(env):
    spec = env.tasks("train")[2]
    env.reset(spec)
    g = env.goal(spec)
    env.step(f"search[{g.type} {' '.join(g.attributes)}]")
    first = next(a for a in env.admissible_actions() if a.startswith("click[b0"))
    env.step(first)
    r = env.step("click[buy now]")                                # no options selected
    assert r.terminated and not r.truncated and not r.info["won"] and r.reward == 0.0
    assert 0.0 < r.info["task_score"] < 1.0
