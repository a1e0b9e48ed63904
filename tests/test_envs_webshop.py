"""WebShop adapter: what can be tested without a WebShop install (it cannot be installed here).

The episode contract is checked against a scripted stand-in for WebShop's text environment (a test
double of ``WebAgentTextEnv``'s reset/step/get_available_actions, not a deliverable).
"""

from __future__ import annotations

import pytest

from interq._optional import MissingDependency
from interq.envs.base import EpisodeError, TaskSpec, UnknownTaskError
from interq.envs.webshop import (
    WebShopEnv, admissible_from, format_observation, html_to_observation, parse_webshop_action,
)


def test_missing_install_gives_install_hint(monkeypatch):
    monkeypatch.delenv("WEBSHOP_PATH", raising=False)
    from interq.envs import make_env

    with pytest.raises(MissingDependency, match="princeton-nlp/WebShop") as e:
        make_env("webshop")
    assert "synthshop" in str(e.value) and "stub" in str(e.value)
    with pytest.raises(ValueError, match="backend"):
        WebShopEnv(backend="selenium")


def test_action_grammar():
    assert parse_webshop_action("search[Red  running shoes]") == ("search", "Red running shoes")
    assert parse_webshop_action("Click[Buy Now]") == ("click", "buy now")
    assert parse_webshop_action("click[]") is None
    assert parse_webshop_action("") is None
    assert parse_webshop_action("buy it") is None
    assert parse_webshop_action("click[" + "x" * 100_000 + "]") is None
    assert parse_webshop_action(None) is None


def test_observation_conversion():
    raw = "WebShop [SEP] Instruction: [SEP] i need red shoes under 50 dollars [SEP] Search"
    assert format_observation(raw) == "WebShop\nInstruction:\ni need red shoes under 50 dollars\nSearch"
    assert admissible_from({"has_search_bar": True, "clickables": ["search"]}) == ("search[<your query>]",
                                                                                   "click[search]")
    assert admissible_from({"has_search_bar": False, "clickables": ["Back to Search", "B09ABC1234"]}) == (
        "click[back to search]", "click[b09abc1234]")


def test_html_page_to_text_observation():
    page = """<html><head><title>t</title><style>p{}</style></head><body>
      <div>Instruction: <br></div><div>i need a blue mug</div>
      <button>Back to Search</button>
      <div>Page 1 (Total results: 2)</div><button>Next &gt;</button>
      <a class="product-link" href="/item">B0ABCDEF12</a><span>Blue Mug, 12 oz</span><span>$9.99</span>
      <script>var x = 1;</script></body></html>"""
    raw, avail = html_to_observation(page)
    assert raw.split(" [SEP] ")[:3] == ["Instruction:", "i need a blue mug", "Back to Search"]
    assert "var x" not in raw and "p{}" not in raw
    assert avail == {"has_search_bar": False, "clickables": ["back to search", "next >", "b0abcdef12"]}
    raw, avail = html_to_observation('<form><input name="search_query" type="text"><button>Search</button></form>')
    assert avail["has_search_bar"] and avail["clickables"] == ["search"]


class _ScriptedShop:
    """Stand-in for WebShop's text env with one product and WebShop's reward on buy now."""

    num_goals = 2000

    def reset(self, goal):
        self.page = "search"
        return ("WebShop [SEP] Instruction: [SEP] i need a blue mug [SEP] Search",
                {"has_search_bar": True, "clickables": ["search"]}, "i need a blue mug")

    def step(self, action):
        if action.startswith("search["):
            self.page = "results"
            return ("Back to Search [SEP] Page 1 (Total results: 1) [SEP] B0ABCDEF12 [SEP] Blue Mug [SEP] $9.99",
                    0.0, False, {"has_search_bar": False, "clickables": ["back to search", "b0abcdef12"]})
        if action == "click[b0abcdef12]":
            return ("Back to Search [SEP] < Prev [SEP] color [SEP] blue [SEP] red [SEP] Blue Mug [SEP] Buy Now",
                    0.0, False, {"has_search_bar": False,
                                 "clickables": ["back to search", "< prev", "blue", "red", "buy now"]})
        if action == "click[buy now]":
            return "Thank you for shopping with us! [SEP] Your score (min 0.0, max 1.0) [SEP] 1.0", 1.0, True, {
                "has_search_bar": False, "clickables": []}
        raise AssertionError(f"unexpected action sent to WebShop: {action!r}")

    def close(self):
        pass


def test_episode_contract_with_scripted_shop():
    env = WebShopEnv(_backend=_ScriptedShop())
    assert [len(env.tasks(s)) for s in ("test", "valid", "train")] == [500, 1000, 500]
    assert env.tasks("train")[0] == TaskSpec("webshop", "1500", "train", "webshop", "")
    with pytest.raises(ValueError, match="split"):
        env.tasks("dev")
    with pytest.raises(EpisodeError):
        env.step("search[mug]")
    for bad in ("2000", "abc", "-1"):
        with pytest.raises(UnknownTaskError):
            env.reset(bad)
    with pytest.raises(UnknownTaskError):
        env.reset(TaskSpec("synthshop", "3", "test"))
    obs = env.reset("1503")
    assert obs.task.description == "i need a blue mug" and obs.task.split == "train"
    assert obs.admissible_actions == ("search[<your query>]", "click[search]")
    # bad input is answered locally, never sent to WebShop, and costs a step
    for bad in ("", "x" * 100_000, "click[buy now]", "buy it"):
        r = env.step(bad)
        assert r.info["valid_action"] is False and r.observation.text.startswith("Invalid action:")
        assert r.reward == 0.0 and not r.terminated
    with pytest.raises(TypeError):
        env.step(None)
    r = env.step("search[blue mug]")
    assert r.info["valid_action"] and "click[b0abcdef12]" in r.observation.admissible_actions
    assert env.step("search[again]").info["valid_action"] is False   # no search bar on this page
    env.step("click[B0ABCDEF12]")
    r = env.step("click[Buy Now]")
    assert r.terminated and r.info["won"] and r.reward == 10.0 and r.info["raw_reward"] == 1.0
    with pytest.raises(EpisodeError):
        env.step("click[buy now]")
    assert env.parse_action("<action>click[Buy Now]</action>").action == "click[buy now]"
    assert env.expert_action() is None


def test_truncation_with_scripted_shop():
    env = WebShopEnv(_backend=_ScriptedShop(), max_steps=2)
    env.reset("0")
    assert not env.step("nonsense").truncated
    r = env.step("nonsense")
    assert r.truncated and not r.terminated


def _fake_webshop(monkeypatch, goals):
    """A stand-in ``web_agent_site.envs`` module whose WebAgentTextEnv has (or lacks) ``server.goals``."""
    import sys
    import types

    class WebAgentTextEnv:
        def __init__(self, **kwargs):
            if goals is not None:
                self.server = types.SimpleNamespace(goals=list(range(goals)))

    pkg, mod = types.ModuleType("web_agent_site"), types.ModuleType("web_agent_site.envs")
    mod.WebAgentTextEnv = WebAgentTextEnv
    pkg.envs = mod
    monkeypatch.setitem(sys.modules, "web_agent_site", pkg)
    monkeypatch.setitem(sys.modules, "web_agent_site.envs", mod)


def test_goal_count_read_or_assumption_said_and_recorded(monkeypatch, capsys):
    from interq.envs import webshop

    monkeypatch.setattr(webshop, "_SAID", set())
    _fake_webshop(monkeypatch, goals=1600)
    env = WebShopEnv()
    assert env.num_goals == 1600 and len(env.tasks("train")) == 100
    assert env.info() == {"env": "webshop", "backend": "text", "num_goals": 1600,
                          "num_goals_source": "WebAgentTextEnv.server.goals"}
    assert capsys.readouterr().err == ""

    _fake_webshop(monkeypatch, goals=None)  # the count cannot be read: WebShop's full set, said and recorded
    env = WebShopEnv()
    err = capsys.readouterr().err.splitlines()
    assert env.num_goals == 12087
    assert len(err) == 1 and err[0].startswith("interq: webshop: num_goals assumed 12087") and "server.goals" in err[0]
    assert env.info()["num_goals_source"].startswith("assumed 12087")
    WebShopEnv()
    assert capsys.readouterr().err == ""  # once per process
    assert WebShopEnv(num_goals=1700).info()["num_goals_source"] == "num_goals argument"
    http = WebShopEnv(backend="http")
    assert http.num_goals == 12087 and http.info()["num_goals_source"].startswith("assumed 12087")
    assert "does not tell its goal count" in capsys.readouterr().err
