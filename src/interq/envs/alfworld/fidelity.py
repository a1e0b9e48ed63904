"""Fidelity check: the built-in ``household`` engine against the real ALFWorld engine.

For each household task: export it as an ALFWorld game (:mod:`.export`), then walk the household
expert's plan in both engines at once. At the start and after every step compare

- the admissible-action sets (both without ``help``): a step *agrees* when the sets are equal;
- the observation text (reported, not part of the two headline shares);

and at the end whether both engines report success. Headline numbers (``FidelityReport``):
``success_agree`` = share of tasks where both engines succeed, ``admissible_agree`` = share of
compared states (initial + after each step) whose sets are equal. Every disagreement is recorded
with the task, step, action and the set difference.

Run ``python -m interq.envs.alfworld.fidelity --per-type 50`` for the report in ``docs/environments.md``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field

from ..household import HouseholdEnv, generate_world
from ..household.world import TASK_TYPES, HouseholdWorld


@dataclass
class TaskFidelity:
    task_id: str
    task_type: str
    steps: int
    household_won: bool
    alfworld_won: bool
    states: int
    states_agree: int
    text_agree: int
    disagreements: list[dict] = field(default_factory=list)


@dataclass
class FidelityReport:
    tasks: int
    success_agree: float        # share of tasks where both engines succeed
    outcome_agree: float        # share of tasks where both engines report the same outcome
    admissible_agree: float     # share of compared states with equal admissible sets
    text_agree: float           # share of compared states with equal observation text
    per_type: dict[str, dict[str, float]]
    seconds: float
    alfworld_steps_per_s: float
    disagreements: list[dict]


def fidelity_worlds(per_type: int, seed: int = 0, split: str = "train", size: str = "full") -> list[HouseholdWorld]:
    """``per_type`` household tasks of each of the six types (indices i with i % 6 = type)."""
    out = []
    for k, ttype in enumerate(TASK_TYPES):
        for j in range(per_type):
            out.append(generate_world(split, 6 * j + k, seed, task_type=ttype, size=size))
    return out


def check_world(world: HouseholdWorld, cache_dir: str, max_steps: int = 60, noise: float = 0.0,
                seed: int = 0) -> TaskFidelity:
    """Walk the household expert's plan in both engines; with ``noise`` > 0 each step is instead, with
    that probability, a random admissible action of the household engine (deterministic in ``seed``),
    which exercises rules off the expert's path (wrong receptacles, examine, inventory, put-backs)."""
    import random

    from .env import AlfworldEnv

    rng = random.Random(f"{seed}|{world.task_id}")
    hh = HouseholdEnv(worlds=[world], max_steps=max_steps, expert="explore")
    aw = AlfworldEnv(worlds=[world], cache_dir=cache_dir, max_steps=max_steps, expert=False)
    try:
        ho = hh.reset(world.task_id)
        ao = aw.reset(world.task_id)
        rec = TaskFidelity(world.task_id, world.task_type, 0, False, False, 0, 0, 0)

        def compare(step: int, action: str | None, h_obs, a_obs):
            rec.states += 1
            hs, as_ = set(h_obs.admissible_actions), set(a_obs.admissible_actions)
            same_text = h_obs.text == a_obs.text
            rec.text_agree += same_text
            if hs == as_:
                rec.states_agree += 1
            if hs != as_ or not same_text:
                rec.disagreements.append({
                    "task_id": world.task_id, "task_type": world.task_type, "step": step, "action": action,
                    "only_household": sorted(hs - as_), "only_alfworld": sorted(as_ - hs),
                    "household_text": None if same_text else h_obs.text,
                    "alfworld_text": None if same_text else a_obs.text})

        compare(0, None, ho, ao)
        for step in range(1, max_steps + 1):
            action = hh.expert_action()
            if action is None:
                break
            if noise > 0 and rng.random() < noise:
                action = rng.choice(sorted(hh.admissible_actions()))
            hr = hh.step(action)
            ar = aw.step(action)
            rec.steps = step
            compare(step, action, hr.observation, ar.observation)
            rec.household_won, rec.alfworld_won = hr.info["won"], ar.info["won"]
            if hr.terminated or hr.truncated or ar.terminated or ar.truncated:
                break
        return rec
    finally:
        aw.close()
        hh.close()


def run_fidelity(per_type: int = 50, seed: int = 0, split: str = "train", size: str = "full",
                 cache_dir: str | None = None, progress: bool = False, max_disagreements: int = 50,
                 noise: float = 0.0) -> FidelityReport:
    worlds = fidelity_worlds(per_type, seed, split, size)
    tmp = None
    if cache_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="interq-fidelity-")
        cache_dir = tmp.name
    t0 = time.perf_counter()
    recs = []
    steps = 0
    try:
        for i, w in enumerate(worlds):
            r = check_world(w, cache_dir, noise=noise, seed=seed)
            recs.append(r)
            steps += r.steps
            if progress:
                print(f"[fidelity] {i + 1}/{len(worlds)} {w.task_id} {w.task_type}: household_won={r.household_won} "
                      f"alfworld_won={r.alfworld_won} states {r.states_agree}/{r.states}", file=sys.stderr, flush=True)
    finally:
        if tmp is not None:
            tmp.cleanup()
    dt = time.perf_counter() - t0
    per_type = {}
    for t in TASK_TYPES:
        rs = [r for r in recs if r.task_type == t]
        if rs:
            per_type[t] = {"tasks": len(rs),
                           "success_agree": sum(r.household_won and r.alfworld_won for r in rs) / len(rs),
                           "admissible_agree": sum(r.states_agree for r in rs) / max(1, sum(r.states for r in rs))}
    n_states = max(1, sum(r.states for r in recs))
    dis = [d for r in recs for d in r.disagreements][:max_disagreements]
    return FidelityReport(
        tasks=len(recs),
        success_agree=sum(r.household_won and r.alfworld_won for r in recs) / max(1, len(recs)),
        outcome_agree=sum(r.household_won == r.alfworld_won for r in recs) / max(1, len(recs)),
        admissible_agree=sum(r.states_agree for r in recs) / n_states,
        text_agree=sum(r.text_agree for r in recs) / n_states,
        per_type=per_type, seconds=dt, alfworld_steps_per_s=steps / dt if dt > 0 else 0.0, disagreements=dis)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="household vs real ALFWorld, along the household expert's plan")
    ap.add_argument("--per-type", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--split", default="train", choices=["train", "valid_seen", "valid_unseen"])
    ap.add_argument("--size", default="full", choices=["full", "small"])
    ap.add_argument("--noise", type=float, default=0.0,
                    help="share of steps replaced by a random admissible action (0: the expert's plan)")
    ap.add_argument("--out", default=None, help="write the full report as JSON here")
    args = ap.parse_args(argv)
    rep = run_fidelity(args.per_type, args.seed, args.split, args.size, progress=True, noise=args.noise)
    d = asdict(rep)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(d, f, indent=1)
    short = {k: v for k, v in d.items() if k != "disagreements"}
    short["disagreements_shown"] = len(rep.disagreements)
    print(json.dumps(short, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
