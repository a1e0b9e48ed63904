"""``synthshop``: an offline WebShop-STYLE shop with a generated catalog (NOT WebShop's data).

WebShop (Yao et al., 2022) cannot run offline (its product data and search index are downloads
under an academic license). This environment keeps WebShop's interface and reward so the
same agent code and prompts apply, over a synthetic catalog:

- **Catalog** (``Catalog``): products with a category, a product type, a title, attributes,
  option groups (color, size, scent, ...), a price, a description, features and reviews;
  deterministic in ``catalog_seed``; ten-character ids like WebShop's ASINs.
- **Instruction**: "i am looking for a t-shirt that is slim fit and cotton, with color: navy blue,
  and price lower than 40.00 dollars" (the target's type, 1-3 of its attributes, 1-2 of its option
  values, a budget above its price).
- **Pages and actions** (WebShop's grammar, text mode, " [SEP] "-separated observations):
  search page (``search[query]``), results (10 per page, at most 50 results; ``click[<item id>]``,
  ``click[next >]``, ``click[< prev]``, ``click[back to search]``), item page (``click[<option value>]``
  selects it, ``click[description]`` / ``click[features]`` / ``click[reviews]`` open sub-pages,
  ``click[< prev]`` goes back, ``click[buy now]`` ends the episode), sub-pages (``click[< prev]``).
  Actions are matched case-insensitively after collapsing blanks. An action that is not available
  on the page leaves the page as it is (``info["valid_action"] = False``).
- **Reward** at ``buy now`` (WebShop's formula):
  ``r = r_type * (|goal attrs matched| + |goal options selected| + [price <= budget]) /
  (|goal attrs| + |goal options| + 1)`` with ``r_type`` = 1.0 for the goal's product type, 0.5 for
  another type of the same category, 0.1 otherwise. Success iff r == 1; the reward returned is
  ``success_reward`` (default 10.0, verl-agent) on success, else 0.0; the raw r is ``info["task_score"]``.
  Buying terminates; 15 steps (default) without buying truncates.
- **Splits**: the catalog is shared (as in WebShop); ``train`` and ``valid_seen`` instructions target
  products of the same product types (disjoint products), ``valid_unseen`` instructions target
  product types never targeted in ``train`` (one held-out type per category).
- ``expert_action()``: searches for the goal's type and attributes, opens the first listed product
  that satisfies the instruction, selects the goal options, buys.
"""

from __future__ import annotations

import hashlib
import math
import random
import re
from collections import defaultdict
from dataclasses import dataclass, field

from .base import (EpisodeError, Observation, ParsedAction, StepResult, TaskSpec, UnknownTaskError, describe_splits,
                   extract_tagged_action, resolve_split_sizes)

SEP = " [SEP] "
SPLITS = ("train", "valid_seen", "valid_unseen")
DEFAULT_SPLIT_SIZES = {"train": 2000, "valid_seen": 100, "valid_unseen": 100}
RESULTS_PER_PAGE = 10
MAX_RESULTS = 50
SEARCH_TEMPLATE = "search[<your query>]"

_COLORS = ("black", "white", "navy blue", "red", "grey", "green", "beige", "pink")
CATEGORIES: dict[str, dict] = {
    "fashion": {
        "types": ("t-shirt", "hoodie", "jeans", "sneakers", "socks", "jacket"),
        "attrs": ("machine wash", "cotton", "slim fit", "long sleeve", "water resistant", "breathable", "stretch",
                  "lightweight"),
        "options": {"color": _COLORS, "size": ("small", "medium", "large", "x-large", "xx-large")},
    },
    "beauty": {
        "types": ("shampoo", "face cream", "lipstick", "sunscreen", "hair oil", "body lotion"),
        "attrs": ("paraben free", "cruelty free", "long lasting", "natural ingredients", "fragrance free", "vegan",
                  "travel size", "sensitive skin"),
        "options": {"scent": ("lavender", "citrus", "vanilla", "unscented", "rose"),
                    "size": ("1 fl oz", "2 fl oz", "4 fl oz", "8 fl oz")},
    },
    "electronics": {
        "types": ("headphones", "phone case", "usb cable", "power bank", "keyboard", "mouse"),
        "attrs": ("wireless", "fast charging", "noise cancelling", "bluetooth", "waterproof", "ergonomic",
                  "high speed", "portable"),
        "options": {"color": _COLORS, "style": ("standard", "pro", "mini", "plus")},
    },
    "home": {
        "types": ("pillow", "curtain", "throw blanket", "desk lamp", "rug", "storage box"),
        "attrs": ("easy clean", "machine washable", "blackout", "soft", "non slip", "eco friendly", "heavy duty",
                  "space saving"),
        "options": {"color": _COLORS, "size": ("twin", "queen", "king", "60x80 inch", "5x7 ft")},
    },
    "grocery": {
        "types": ("coffee", "green tea", "snack bar", "olive oil", "honey", "dark chocolate"),
        "attrs": ("gluten free", "organic", "sugar free", "non gmo", "low calorie", "keto friendly", "kosher",
                  "high protein"),
        "options": {"flavor": ("original", "caramel", "mint", "berry", "hazelnut"),
                    "pack size": ("pack of 1", "pack of 3", "pack of 6", "pack of 12")},
    },
}
# The last type of every category is never targeted in train/valid_seen (valid_unseen targets only these).
UNSEEN_TYPES = frozenset(c["types"][-1] for c in CATEGORIES.values())
_BRANDS = ("Norvik", "Alder & Co", "Brightline", "Casa Verde", "Dunmore", "Everpeak", "Fjordic", "Goldleaf",
           "Harbor", "Ivoria", "Juniper", "Kestrel", "Lumen", "Maple Row", "Northwind", "Oakhurst")


def _rng(*parts: object) -> random.Random:
    return random.Random(int.from_bytes(hashlib.sha256("|".join(map(str, parts)).encode()).digest()[:8], "big"))


def _tokens(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


@dataclass(frozen=True)
class Product:
    asin: str                                    # "B0XXXXXXXX" (clicked lower-cased)
    category: str
    type: str
    title: str
    attributes: tuple[str, ...]
    options: tuple[tuple[str, tuple[str, ...]], ...]   # ((group, (value, ...)), ...)
    price: float
    rating: float
    description: str
    features: tuple[str, ...]
    reviews: tuple[str, ...]

    def option_values(self) -> dict[str, str]:
        """value -> group."""
        return {v: g for g, vs in self.options for v in vs}


@dataclass(frozen=True)
class ShopGoal:
    task_id: str
    split: str
    target_asin: str
    category: str
    type: str
    attributes: tuple[str, ...]
    options: tuple[tuple[str, str], ...]        # ((group, value), ...)
    budget: float
    instruction: str


class Catalog:
    """A deterministic synthetic catalog with a token-overlap (idf-weighted) search."""

    def __init__(self, seed: int = 0, products_per_type: int = 40):
        if products_per_type < 2:
            raise ValueError(f"products_per_type must be >= 2; got {products_per_type}")
        rng = _rng("synthshop-catalog", seed)
        products: list[Product] = []
        seen: set[str] = set()
        for cat, spec in CATEGORIES.items():
            for ptype in spec["types"]:
                base = rng.uniform(8, 90)
                for _ in range(products_per_type):
                    asin = "B0" + "".join(rng.choice("ABCDEFGHJKLMNPQRSTUVWXYZ0123456789") for _ in range(8))
                    if asin in seen:
                        continue
                    seen.add(asin)
                    attrs = tuple(sorted(rng.sample(spec["attrs"], rng.randint(2, 4))))
                    opts = tuple((g, tuple(sorted(rng.sample(vals, rng.randint(2, min(4, len(vals)))))))
                                 for g, vals in spec["options"].items())
                    price = round(max(2.0, base * rng.uniform(0.5, 1.8))) - 0.01
                    brand = rng.choice(_BRANDS)
                    shown = attrs[: rng.randint(1, 2)]
                    title = " ".join(w.capitalize() for w in f"{brand} {' '.join(shown)} {ptype}".split())
                    desc = (f"This {ptype} from {brand} is {', '.join(attrs)}. "
                            f"Available in {', '.join(v for _, vs in opts for v in vs)}.")
                    feats = tuple(f"{a.capitalize()} design" for a in attrs)
                    revs = tuple(rng.choice(("Great value.", "Works as described.", "Would buy again.",
                                             "Smaller than expected.", "Good quality for the price.")) for _ in range(2))
                    products.append(Product(asin, cat, ptype, title, attrs, opts, price, round(rng.uniform(2.5, 5.0), 1),
                                            desc, feats, revs))
        self.products = tuple(products)
        self._pools: dict[str, list[Product]] = {}
        self.by_asin = {p.asin.lower(): p for p in products}
        self._index: dict[str, set[int]] = defaultdict(set)
        for i, p in enumerate(products):
            for t in set(_tokens(f"{p.title} {p.type} {p.category} {' '.join(p.attributes)}")):
                self._index[t].add(i)
        n = len(products)
        self._idf = {t: math.log(1 + n / len(ix)) for t, ix in self._index.items()}

    def target_pool(self, split: str) -> list[Product]:
        """Products an instruction of ``split`` may target: unseen types for valid_unseen; else seen types,
        split 90/10 between train and valid_seen by a hash of the id (disjoint targets)."""
        if split not in self._pools:
            if split == "valid_unseen":
                pool = [p for p in self.products if p.type in UNSEEN_TYPES]
            else:
                want = split == "valid_seen"
                pool = [p for p in self.products if p.type not in UNSEEN_TYPES
                        and (int(hashlib.sha256(p.asin.encode()).hexdigest(), 16) % 10 == 0) == want]
            self._pools[split] = pool
        return self._pools[split]

    def search(self, query: str) -> list[Product]:
        """Top ``MAX_RESULTS`` products by summed idf of matching query tokens (ties: asin)."""
        scores: dict[int, float] = defaultdict(float)
        for t in set(_tokens(query)):
            for i in self._index.get(t, ()):
                scores[i] += self._idf[t]
        ranked = sorted(scores, key=lambda i: (-scores[i], self.products[i].asin))
        return [self.products[i] for i in ranked[:MAX_RESULTS]]


def satisfies(p: Product, goal: ShopGoal) -> bool:
    """Could buying ``p`` (with the right options) score r == 1?"""
    vals = p.option_values()
    return (p.type == goal.type and set(goal.attributes) <= set(p.attributes) and p.price <= goal.budget
            and all(vals.get(v) == g for g, v in goal.options))


def shop_reward(p: Product, selected: dict[str, str], goal: ShopGoal) -> float:
    """WebShop's reward: r_type * (attrs matched + options matched + [price <= budget]) / (|attrs| + |options| + 1)."""
    r_type = 1.0 if p.type == goal.type else (0.5 if p.category == goal.category else 0.1)
    attrs = sum(1 for a in goal.attributes if a in p.attributes)
    opts = sum(1 for g, v in goal.options if selected.get(g) == v)
    price = 1 if p.price <= goal.budget else 0
    return r_type * (attrs + opts + price) / (len(goal.attributes) + len(goal.options) + 1)


def make_goal(catalog: Catalog, split: str, index: int, seed: int = 0) -> ShopGoal:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {list(SPLITS)}; got {split!r}")
    rng = _rng("synthshop-goal", seed, split, index)
    p = rng.choice(catalog.target_pool(split))
    attrs = tuple(sorted(rng.sample(p.attributes, rng.randint(1, min(3, len(p.attributes))))))
    groups = rng.sample(list(p.options), rng.randint(1, len(p.options)))
    opts = tuple((g, rng.choice(vs)) for g, vs in sorted(groups))
    budget = float(math.ceil(p.price * rng.uniform(1.05, 1.6)))
    attr_txt = " and ".join(attrs)
    opt_txt = ", and ".join(f"{g}: {v}" for g, v in opts)
    instr = f"i am looking for a {p.type} that is {attr_txt}, with {opt_txt}, and price lower than {budget:.2f} dollars"
    return ShopGoal(f"{split}-{index:05d}", split, p.asin, p.category, p.type, attrs, opts, budget, instr)


@dataclass
class _State:
    page: str = "search"                 # search | results | item | sub
    query: str = ""
    results: list[Product] = field(default_factory=list)
    page_no: int = 1
    item: Product | None = None
    sub: str = ""
    selected: dict[str, str] = field(default_factory=dict)


class SynthShopEnv:
    """The WebShop-style environment (see module docstring).

    Args:
        seed: instruction set; catalog_seed: the catalog; products_per_type: catalog size knob
        (36 types x products_per_type products); split_sizes; max_steps (default 15);
        success_reward (default 10.0).
    """

    name = "synthshop"

    def __init__(self, seed: int = 0, catalog_seed: int = 0, products_per_type: int = 40,
                 split_sizes: dict[str, int] | None = None, max_steps: int = 15, success_reward: float = 10.0):
        if not isinstance(max_steps, int) or max_steps < 1:
            raise ValueError(f"max_steps must be a positive int; got {max_steps!r}")
        sizes = resolve_split_sizes(DEFAULT_SPLIT_SIZES, split_sizes)
        self.seed, self.split_sizes, self.max_steps = int(seed), sizes, max_steps
        self.success_reward = float(success_reward)
        self.catalog_seed, self.products_per_type = catalog_seed, products_per_type
        self.catalog = Catalog(catalog_seed, products_per_type)
        self._goals: dict[str, ShopGoal] = {}
        self._goal: ShopGoal | None = None
        self._task: TaskSpec | None = None
        self._state = _State()
        self._steps = 0
        self._done = False

    def info(self) -> dict:
        """What this env plays, for the run's records (``env_info.json``; the warm start's ``policy_summary.json``):
        the engine (not WebShop's data), the catalog, each split's size and task types (product categories), and the
        episode settings. Lists the tasks of every split; changes nothing an episode sees."""
        from interq import __version__

        return {"env": self.name,
                "engine": "synthshop: interq's built-in WebShop-style shop (WebShop's actions and reward over a "
                          "generated catalog, not WebShop's product data)",
                "version": f"interq {__version__}", "source": "generated", "seed": self.seed,
                "catalog": {"seed": self.catalog_seed, "products_per_type": self.products_per_type,
                            "products": len(self.catalog.products), "categories": len(CATEGORIES),
                            "product_types": sum(len(c["types"]) for c in CATEGORIES.values())},
                "unseen_product_types": sorted(UNSEEN_TYPES),  # targeted only by valid_unseen
                **describe_splits(self, SPLITS), "max_steps": self.max_steps, "success_reward": self.success_reward}

    # ---- tasks ---------------------------------------------------------------------------------
    def goal(self, task: TaskSpec | str) -> ShopGoal:
        task_id = task.task_id if isinstance(task, TaskSpec) else task
        if isinstance(task, TaskSpec) and task.env != self.name:
            raise UnknownTaskError(f"task {task_id!r} belongs to env {task.env!r}, not 'synthshop'")
        split, sep, num = str(task_id).rpartition("-")
        if not sep or split not in SPLITS or not num.isdigit() or int(num) >= self.split_sizes[split]:
            raise UnknownTaskError(f"unknown synthshop task {task_id!r}: ids look like '<split>-<index>' with split in "
                                   f"{list(SPLITS)} and index below the split size {self.split_sizes}")
        if task_id not in self._goals:
            self._goals[task_id] = make_goal(self.catalog, split, int(num), self.seed)
        return self._goals[task_id]

    def tasks(self, split: str) -> list[TaskSpec]:
        if split not in SPLITS:
            raise ValueError(f"split must be one of {list(SPLITS)}; got {split!r}")
        out = []
        for i in range(self.split_sizes[split]):
            g = self.goal(f"{split}-{i:05d}")
            out.append(TaskSpec(env=self.name, task_id=g.task_id, split=split, task_type=g.category,
                                description=g.instruction))
        return out

    # ---- pages ---------------------------------------------------------------------------------
    def _render(self) -> str:
        s = self._state
        if s.page == "search":
            return SEP.join(["SynthShop", "Instruction:", self._goal.instruction, "Search"])
        if s.page == "results":
            n = len(s.results)
            parts = ["Back to Search", f"Page {s.page_no} (Total results: {n})"]
            if s.page_no > 1:
                parts.append("< Prev")
            if s.page_no * RESULTS_PER_PAGE < n:
                parts.append("Next >")
            for p in self._page_items():
                parts += [p.asin, p.title, f"${p.price:.2f}"]
            return SEP.join(parts)
        if s.page == "item":
            p = s.item
            parts = ["Back to Search", "< Prev"]
            for g, vs in p.options:
                parts += [g, *vs]
            parts += [p.title, f"Price: ${p.price:.2f}", f"Rating: {p.rating}", "Description", "Features", "Reviews",
                      "Buy Now"]
            return SEP.join(parts)
        p = s.item
        body = {"description": [p.description], "features": list(p.features), "reviews": list(p.reviews)}[s.sub]
        return SEP.join(["Back to Search", "< Prev", *body])

    def _page_items(self) -> list[Product]:
        s = self._state
        return s.results[(s.page_no - 1) * RESULTS_PER_PAGE: s.page_no * RESULTS_PER_PAGE]

    def _clickables(self) -> list[str]:
        s = self._state
        if s.page == "search":
            return []
        out = ["back to search"]
        if s.page == "results":
            if s.page_no > 1:
                out.append("< prev")
            if s.page_no * RESULTS_PER_PAGE < len(s.results):
                out.append("next >")
            out += [p.asin.lower() for p in self._page_items()]
        elif s.page == "item":
            out.append("< prev")
            out += [v for _, vs in s.item.options for v in vs]
            out += ["description", "features", "reviews", "buy now"]
        else:
            out.append("< prev")
        return out

    def admissible_actions(self) -> tuple[str, ...]:
        if self._goal is None:
            raise EpisodeError("no episode: call reset(task) first")
        if self._state.page == "search":
            return (SEARCH_TEMPLATE,)
        return tuple(f"click[{c}]" for c in self._clickables())

    def _obs(self) -> Observation:
        text = self._render()
        return Observation(text=text, admissible_actions=self.admissible_actions(), anchor=text, task=self._task)

    # ---- episode -------------------------------------------------------------------------------
    def reset(self, task: TaskSpec | str) -> Observation:
        g = self.goal(task)
        self._goal = g
        self._task = TaskSpec(env=self.name, task_id=g.task_id, split=g.split, task_type=g.category,
                              description=g.instruction)
        self._state = _State()
        self._steps = 0
        self._done = False
        return self._obs()

    def _apply(self, action: str) -> tuple[bool, bool]:
        """Apply a normalized action. Returns (valid, bought)."""
        s = self._state
        m = re.fullmatch(r"(search|click)\[(.*)\]", action)
        if not m:
            return False, False
        kind, arg = m.group(1), " ".join(m.group(2).split())
        if kind == "search":
            if s.page != "search" or not arg:
                return False, False
            s.query, s.results, s.page_no, s.page = arg, self.catalog.search(arg), 1, "results"
            return True, False
        if arg not in self._clickables():
            return False, False
        if arg == "back to search":
            self._state = _State()
            return True, False
        if s.page == "results":
            if arg == "next >":
                s.page_no += 1
            elif arg == "< prev":
                s.page_no -= 1
            else:
                s.item, s.selected, s.page = self.catalog.by_asin[arg], {}, "item"
            return True, False
        if s.page == "item":
            if arg == "< prev":
                s.page = "results"
            elif arg in ("description", "features", "reviews"):
                s.page, s.sub = "sub", arg
            elif arg == "buy now":
                return True, True
            else:
                s.selected[s.item.option_values()[arg]] = arg
            return True, False
        s.page = "item"  # sub-page: "< prev"
        return True, False

    def step(self, action: str) -> StepResult:
        if self._goal is None:
            raise EpisodeError("step() before reset(): call reset(task) first")
        if self._done:
            raise EpisodeError(f"episode of task {self._task.task_id!r} has ended; call reset(task) before step()")
        if not isinstance(action, str):
            raise TypeError(f"action must be a str (use parse_action on generated text); got {type(action).__name__}")
        valid, bought = self._apply(" ".join(action.lower().split()))
        self._steps += 1
        score = shop_reward(self._state.item, self._state.selected, self._goal) if bought else 0.0
        won = bought and score >= 1.0 - 1e-9
        terminated = bought
        truncated = not terminated and self._steps >= self.max_steps
        self._done = terminated or truncated
        obs = self._obs() if not bought else Observation(
            text=f"Thank you for shopping with us! [SEP] Your score (min 0.0, max 1.0) [SEP] {score:.2f}",
            admissible_actions=(), anchor="bought", task=self._task)
        info = {"won": won, "valid_action": valid, "step": self._steps, "task_id": self._task.task_id,
                "task_type": self._task.task_type, "task_score": score,
                "bought": self._state.item.asin if bought else None}
        return StepResult(obs, self.success_reward if won else 0.0, terminated, truncated, info)

    def parse_action(self, generated_text: str) -> ParsedAction:
        return extract_tagged_action(generated_text, lower=True)

    def expert_action(self) -> str | None:
        if self._goal is None or self._done:
            return None
        g, s = self._goal, self._state
        if s.page == "search":
            return f"search[{g.type} {' '.join(g.attributes)}]"
        if s.page == "sub":
            return "click[< prev]"
        if s.page == "item":
            if not satisfies(s.item, g):
                return "click[< prev]"
            for grp, v in g.options:
                if s.selected.get(grp) != v:
                    return f"click[{v}]"
            return "click[buy now]"
        for p in self._page_items():
            if satisfies(p, g):
                return f"click[{p.asin.lower()}]"
        if s.page_no * RESULTS_PER_PAGE < len(s.results):
            return "click[next >]"
        return "click[back to search]"  # pragma: no cover - the target always ranks in the results

    def close(self) -> None:
        self._goal = None
