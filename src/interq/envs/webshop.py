"""WebShop adapter for users who have a WebShop install (princeton-nlp/WebShop).

WebShop cannot be installed offline: the PyPI package ``webshop`` is a 5 KB stub, the real
environment is a source checkout plus product data and a search index downloaded from outside. For
an offline WebShop-*style* shop, use ``make_env("synthshop")`` (a generated catalog, not WebShop's data).

Two back-ends, same Env contract:

- ``backend="text"`` (default): WebShop's own text environment in-process,
  ``web_agent_site.envs.WebAgentTextEnv(observation_mode="text", num_products=...)``. The checkout must be
  importable (``pip install -e`` it, put it on ``PYTHONPATH``, or pass ``webshop_path=``/set ``WEBSHOP_PATH``).
- ``backend="http"``: a running WebShop site (``python -m web_agent_site.app``, default
  ``http://127.0.0.1:3000``), read over HTTP page by page (``requests``/``urllib``; the pages are turned
  into WebShop's text observation: visible texts joined by ``" [SEP] "``). URLs follow the site's routes
  (``/<session>``, ``/search_results/<session>/<keywords>/<page>``, ``/item_page/<session>/<asin>/<keywords>/
  <page>/<options>``, ``/item_sub_page/.../<sub_page>/<options>``, ``/done/<session>/<asin>/<options>``),
  as ReAct's and verl-agent's HTTP clients use them. Not exercised here (no WebShop site offline).

Contract:

- Tasks: WebShop's goal indices, split as in WebShop's and verl-agent's code: ``test`` = 0-499,
  ``valid`` = 500-1499, ``train`` = 1500 up to ``num_goals`` (12,087 with the full data). Task ids are the
  goal index as a string ("1503"); the TaskSpec description is filled at reset with the instruction.
- Observation text: WebShop's text with its ``[SEP]`` separators turned into line breaks
  (:func:`format_observation`); ``anchor`` keeps WebShop's raw text; ``admissible_actions`` =
  ``search[<query>]`` when the page has a search bar, plus ``click[<clickable>]`` for every clickable.
- Actions: ``search[<query>]`` (only where there is a search bar) or ``click[<clickable>]`` (one of the
  page's clickables, case-insensitive). Anything else (``""``, a 100 KB string, an unknown button, a
  malformed action) is *not sent* to WebShop: the observation is the current page again, prefixed
  with "Invalid action: ..." (``info["valid_action"] = False``), and it costs a step.
- Reward: WebShop's reward ``r`` in [0, 1] comes with ``click[buy now]``, which ends the episode
  (``terminated``); ``won`` iff ``r == 1``; the returned reward is ``success_reward`` (10) iff won, else 0
  (verl-agent's convention; ``info["raw_reward"] = r``). ``max_steps`` (15) truncates.
- ``step`` before ``reset`` / after the end: :class:`EpisodeError`; a non-str action: ``TypeError``;
  an unknown task: :class:`UnknownTaskError`. WebShop missing: :class:`MissingDependency` saying how
  to install it.
"""

from __future__ import annotations

import html as _html
import os
import re
import sys
from html.parser import HTMLParser
from typing import Any
from urllib.parse import quote

from .._optional import MissingDependency
from .base import EpisodeError, Observation, ParsedAction, StepResult, TaskSpec, UnknownTaskError, extract_tagged_action

SPLITS = ("train", "valid", "test")
SPLIT_RANGES = {"test": (0, 500), "valid": (500, 1500), "train": (1500, None)}
FULL_NUM_GOALS = 12087
BACKENDS = ("text", "http")
INSTALL_HINT = ("WebShop is not installable from PyPI (the 'webshop' package there is a stub). Install it from "
                "source: git clone https://github.com/princeton-nlp/WebShop && cd WebShop && ./setup.sh -d all "
                "(downloads its product data and builds its search index; academic license), then make it "
                "importable (pip install -e ., PYTHONPATH, or webshop_path=/WEBSHOP_PATH). For an offline "
                "WebShop-style environment use make_env('synthshop').")
_ACTION_RE = re.compile(r"^\s*(search|click)\s*\[(.*)\]\s*$", re.IGNORECASE | re.DOTALL)
MAX_ACTION_CHARS = 500


def parse_webshop_action(action: str) -> tuple[str, str] | None:
    """``"click[Buy Now]"`` -> ``("click", "buy now")``; None when it is not WebShop's grammar. Never raises."""
    if not isinstance(action, str) or len(action) > MAX_ACTION_CHARS:
        return None
    m = _ACTION_RE.match(action)
    if not m:
        return None
    kind, arg = m.group(1).lower(), " ".join(m.group(2).split())
    if not arg:
        return None
    return kind, arg if kind == "search" else arg.lower()


def format_observation(raw: str) -> str:
    """WebShop's text observation (``"WebShop [SEP] Instruction: [SEP] ..."``) as lines."""
    parts = [p.strip() for p in raw.split("[SEP]")]
    return "\n".join(p for p in parts if p)


def admissible_from(available: dict[str, Any]) -> tuple[str, ...]:
    """WebShop's ``get_available_actions()`` dict -> action strings."""
    out = []
    if available.get("has_search_bar"):
        out.append("search[<your query>]")
    out += [f"click[{str(c).lower()}]" for c in available.get("clickables", [])]
    return tuple(out)


class _VisibleText(HTMLParser):
    """Visible text runs of an HTML page (WebShop's text mode: no script/style/head/title/meta)."""

    _IGNORE = {"style", "script", "head", "title", "meta"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self._stack: list[str] = []
        self.buttons: list[str] = []
        self.has_search = False
        self._in_button = 0
        self._btn: list[str] = []

    def handle_starttag(self, tag, attrs):
        self._stack.append(tag)
        a = dict(attrs)
        if tag == "input" and a.get("name") == "search_query":
            self.has_search = True
        if tag == "button" or (tag == "a" and a.get("class") and "product-link" in a.get("class", "")) \
                or (tag == "input" and a.get("type") == "radio"):
            if tag == "input":
                if a.get("value"):
                    self.buttons.append(a["value"])
            else:
                self._in_button += 1
                self._btn = []

    def handle_endtag(self, tag):
        if tag in ("button", "a") and self._in_button:
            self._in_button -= 1
            text = " ".join(" ".join(self._btn).split())
            if text:
                self.buttons.append(text)
        while self._stack:
            if self._stack.pop() == tag:
                break

    def handle_data(self, data):
        if any(t in self._IGNORE for t in self._stack):
            return
        text = data.strip()
        if text:
            self.parts.append(text)
            if self._in_button:
                self._btn.append(text)


def html_to_observation(page: str) -> tuple[str, dict[str, Any]]:
    """A WebShop page's HTML -> (raw text observation joined by " [SEP] ", available-actions dict)."""
    p = _VisibleText()
    p.feed(page)
    p.close()
    raw = " [SEP] ".join(_html.unescape(t) for t in p.parts)
    clickables = []
    for b in p.buttons:
        b = b.lower()
        if b not in clickables:
            clickables.append(b)
    return raw, {"has_search_bar": p.has_search, "clickables": clickables}


_SAID: set[str] = set()


def _assumed_goals(why: str) -> tuple[int, str]:
    """WebShop's full goal count when the real one is not known: said on stderr (once per process) and recorded
    (``info()``)."""
    source = f"assumed {FULL_NUM_GOALS} (WebShop's full set): {why}; pass num_goals= to set it"
    if source not in _SAID:
        _SAID.add(source)
        print(f"interq: webshop: num_goals {source}", file=sys.stderr, flush=True)
    return FULL_NUM_GOALS, source


class _TextBackend:
    def __init__(self, num_products: int | None, webshop_path: str | None, num_goals: int | None = None):
        path = webshop_path or os.environ.get("WEBSHOP_PATH")
        if path and path not in sys.path:
            sys.path.insert(0, path)
        try:
            from web_agent_site.envs import WebAgentTextEnv  # noqa: PLC0415 - optional dependency
        except ImportError as e:
            raise MissingDependency(f"WebShop's text environment (web_agent_site) could not be imported ({e}). "
                                    + INSTALL_HINT) from e
        kwargs = {"observation_mode": "text"}
        if num_products is not None:
            kwargs["num_products"] = num_products
        self.env = WebAgentTextEnv(**kwargs)
        goals = getattr(getattr(self.env, "server", None), "goals", None)
        if goals is not None:
            self.num_goals, self.num_goals_source = len(goals), "WebAgentTextEnv.server.goals"
        elif num_goals is not None:
            self.num_goals, self.num_goals_source = int(num_goals), "num_goals argument"
        else:
            self.num_goals, self.num_goals_source = _assumed_goals("WebAgentTextEnv.server.goals could not be read")

    def reset(self, goal: int) -> tuple[str, dict, str]:
        obs, _info = self.env.reset(session=goal)
        return obs, self.env.get_available_actions(), str(getattr(self.env, "instruction_text", ""))

    def step(self, action: str) -> tuple[str, float, bool, dict]:
        obs, reward, done, _info = self.env.step(action)
        return obs, float(reward or 0.0), bool(done), self.env.get_available_actions()

    def close(self):
        try:
            self.env.close()
        except Exception:
            pass


class _HttpBackend:
    """Page-by-page client of a running WebShop site (see module docstring for the routes)."""

    def __init__(self, base_url: str, num_goals: int | None, timeout_s: float = 30.0):
        self.base = base_url.rstrip("/")
        if num_goals is not None:
            self.num_goals, self.num_goals_source = int(num_goals), "num_goals argument"
        else:
            self.num_goals, self.num_goals_source = _assumed_goals("a WebShop site does not tell its goal count")
        self.timeout_s = timeout_s
        self.session = ""
        self.keywords = ""
        self.page = 1
        self.asin = ""
        self.options: dict[str, str] = {}
        self.avail: dict[str, Any] = {}
        self.item_options: list[str] = []

    def _get(self, path: str) -> str:
        import urllib.request
        try:
            with urllib.request.urlopen(self.base + path, timeout=self.timeout_s) as r:
                return r.read().decode("utf-8", errors="replace")
        except OSError as e:
            raise ConnectionError(f"WebShop site at {self.base} did not answer {path!r}: {e}. Start it with "
                                  f"'python -m web_agent_site.app' in the WebShop checkout") from e

    def _load(self, path: str) -> str:
        raw, self.avail = html_to_observation(self._get(path))
        return raw

    def reset(self, goal: int):
        self.session, self.keywords, self.page, self.asin, self.options = f"fixed_{goal}", "", 1, "", {}
        raw = self._load(f"/{quote(self.session)}")
        m = re.search(r"Instruction:\s*\[SEP\]\s*(.*?)\s*\[SEP\]", raw)
        return raw, self.avail, (m.group(1) if m else "")

    def _opts(self) -> str:
        return quote(str(self.options).replace("'", '"'), safe="")

    def step(self, action: str):
        kind, arg = parse_webshop_action(action)
        s = quote(self.session)
        if kind == "search":
            self.keywords, self.page, self.asin, self.options = arg, 1, "", {}
            return self._load(f"/search_results/{s}/{quote(arg)}/1"), 0.0, False, self.avail
        if arg == "buy now" and self.asin:
            raw = self._load(f"/done/{s}/{quote(self.asin)}/{self._opts()}")
            m = re.search(r"Your score \(min 0\.0, max 1\.0\)\s*\[SEP\]\s*([0-9.]+)", raw)
            return raw, float(m.group(1)) if m else 0.0, True, self.avail
        if arg == "back to search":
            self.keywords, self.asin, self.options = "", "", {}
            return self._load(f"/{s}"), 0.0, False, self.avail
        if arg in ("next >", "< prev"):
            self.page = max(1, self.page + (1 if arg == "next >" else -1))
            return self._load(f"/search_results/{s}/{quote(self.keywords)}/{self.page}"), 0.0, False, self.avail
        if arg in ("description", "features", "reviews", "attributes") and self.asin:
            return (self._load(f"/item_sub_page/{s}/{quote(self.asin)}/{quote(self.keywords)}/{self.page}/"
                               f"{quote(arg.capitalize())}/{self._opts()}"), 0.0, False, self.avail)
        if self.asin and arg in self.avail.get("clickables", []) and not re.fullmatch(r"b[0-9a-z]{9}", arg):
            self.options[str(len(self.options))] = arg  # an option of the item page
            return (self._load(f"/item_page/{s}/{quote(self.asin)}/{quote(self.keywords)}/{self.page}/{self._opts()}"),
                    0.0, False, self.avail)
        self.asin, self.options = arg.upper(), {}
        return (self._load(f"/item_page/{s}/{quote(self.asin)}/{quote(self.keywords)}/{self.page}/{self._opts()}"),
                0.0, False, self.avail)

    def close(self):
        pass


class WebShopEnv:
    """WebShop (a real install) behind the Env protocol; see the module docstring.

    Args:
        backend: "text" (in-process WebAgentTextEnv) or "http" (a running WebShop site).
        num_products: WebAgentTextEnv's ``num_products`` (None: its default, all products).
        webshop_path: directory of the WebShop checkout to import (default ``$WEBSHOP_PATH``).
        base_url: the site for backend "http".
        num_goals: number of goals when WebShop does not tell it (backend "http"; backend "text" when its
            ``server.goals`` cannot be read). Not given there: 12,087 (WebShop's full set), said on stderr and
            recorded by ``info()`` (``num_goals_source``).
        max_steps: step limit (15, verl-agent). success_reward: reward when WebShop's r == 1 (10.0).
    """

    name = "webshop"

    def __init__(self, backend: str = "text", num_products: int | None = None, webshop_path: str | None = None,
                 base_url: str = "http://127.0.0.1:3000", num_goals: int | None = None, max_steps: int = 15,
                 success_reward: float = 10.0, _backend: Any = None):
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {list(BACKENDS)}; got {backend!r}")
        if not isinstance(max_steps, int) or isinstance(max_steps, bool) or max_steps < 1:
            raise ValueError(f"max_steps must be a positive int; got {max_steps!r}")
        self.max_steps = max_steps
        self.success_reward = float(success_reward)
        if _backend is not None:      # tests: any object with reset/step/close/num_goals
            self._be = _backend
        elif backend == "text":
            self._be = _TextBackend(num_products, webshop_path, num_goals)
        else:
            self._be = _HttpBackend(base_url, num_goals)
        self.backend = backend
        self.num_goals = int(self._be.num_goals)
        self.num_goals_source = str(getattr(self._be, "num_goals_source", "backend"))
        self._task: TaskSpec | None = None
        self._raw = ""
        self._avail: dict[str, Any] = {}
        self._steps = 0
        self._done = True
        self._started = False

    def info(self) -> dict:
        """What this env plays, for the run's records: the back-end and where its goal count came from."""
        return {"env": self.name, "backend": self.backend, "num_goals": self.num_goals,
                "num_goals_source": self.num_goals_source}

    def tasks(self, split: str) -> list[TaskSpec]:
        if split not in SPLITS:
            raise ValueError(f"split must be one of {list(SPLITS)}; got {split!r}")
        lo, hi = SPLIT_RANGES[split]
        hi = self.num_goals if hi is None else min(hi, self.num_goals)
        return [TaskSpec("webshop", str(i), split, "webshop", "") for i in range(lo, hi)]

    def _goal(self, task: TaskSpec | str) -> tuple[int, TaskSpec]:
        if isinstance(task, TaskSpec):
            if task.env != self.name:
                raise UnknownTaskError(f"task {task.task_id!r} belongs to env {task.env!r}, not 'webshop'")
            tid = task.task_id
        elif isinstance(task, str):
            tid = task
        else:
            raise TypeError(f"task must be a TaskSpec or a goal index str; got {type(task).__name__}")
        if not tid.isdigit() or int(tid) >= self.num_goals:
            raise UnknownTaskError(f"unknown WebShop task {tid!r}: task ids are goal indices '0'-'{self.num_goals - 1}'")
        g = int(tid)
        split = next(s for s, (lo, hi) in SPLIT_RANGES.items() if g >= lo and (hi is None or g < hi))
        return g, task if isinstance(task, TaskSpec) else TaskSpec("webshop", tid, split, "webshop", "")

    def _obs(self, prefix: str = "") -> Observation:
        text = format_observation(self._raw)
        return Observation(text=prefix + text, admissible_actions=admissible_from(self._avail), anchor=self._raw,
                           task=self._task)

    def reset(self, task: TaskSpec | str) -> Observation:
        g, spec = self._goal(task)
        self._raw, self._avail, instruction = self._be.reset(g)
        self._task = TaskSpec(spec.env, spec.task_id, spec.split, spec.task_type, instruction or spec.description)
        self._steps, self._done, self._started = 0, False, True
        return self._obs()

    def admissible_actions(self) -> tuple[str, ...]:
        if not self._started:
            raise EpisodeError("no episode: call reset(task) first")
        return admissible_from(self._avail)

    def check_action(self, action: str) -> str | None:
        """None when ``action`` can be sent to WebShop on the current page, else the reason."""
        parsed = parse_webshop_action(action)
        if parsed is None:
            return "expected search[<query>] or click[<button>]"
        kind, arg = parsed
        if kind == "search" and not self._avail.get("has_search_bar"):
            return "there is no search bar on this page"
        if kind == "click" and arg not in [str(c).lower() for c in self._avail.get("clickables", [])]:
            return f"{arg!r} is not clickable on this page"
        return None

    def step(self, action: str) -> StepResult:
        if not self._started:
            raise EpisodeError("step() before reset(): call reset(task) first")
        if self._done:
            raise EpisodeError(f"episode of task {self._task.task_id!r} has ended; call reset(task) before step()")
        if not isinstance(action, str):
            raise TypeError(f"action must be a str (use parse_action on generated text); got {type(action).__name__}")
        self._steps += 1
        problem = self.check_action(action)
        raw_reward, done, prefix = 0.0, False, ""
        if problem is None:
            kind, arg = parse_webshop_action(action)
            self._raw, raw_reward, done, self._avail = self._be.step(f"{kind}[{arg}]")
        else:
            prefix = f"Invalid action: {problem}.\n"
        won = bool(done and raw_reward >= 1.0)
        truncated = (not done) and self._steps >= self.max_steps
        self._done = done or truncated
        info = {"won": won, "valid_action": problem is None, "step": self._steps, "raw_reward": raw_reward,
                "task_id": self._task.task_id, "task_type": "webshop"}
        return StepResult(self._obs(prefix), self.success_reward if won else 0.0, done, truncated, info)

    def parse_action(self, generated_text: str) -> ParsedAction:
        return extract_tagged_action(generated_text, lower=True)

    def expert_action(self) -> str | None:
        """WebShop ships human demonstrations, not a planner: no expert here (always None)."""
        return None

    def close(self) -> None:
        be = getattr(self, "_be", None)
        if be is not None:
            be.close()
        self._started = False


def make_env(**kwargs) -> WebShopEnv:
    return WebShopEnv(**kwargs)


__all__ = ["WebShopEnv", "SPLITS", "admissible_from", "format_observation", "html_to_observation", "make_env",
           "parse_webshop_action"]
