"""One policy judged on two engines: a household policy on the same held-out task instances in the
built-in ``household`` engine and in the real ALFWorld engine, with the same sampling seeds.

    .venv/bin/python scripts/cross_engine_eval.py POLICY_DIR [--tasks N] [--temperature T] [--json FILE] [key=value ...]

- The settings: ``POLICY_DIR/run_config.yaml`` when the directory has one (a warm start or run written by ``interq``),
  else the demo's (``household`` preset + ``interq.train.experiments.DEMO_OVERRIDES``); ``key=value`` overrides on
  top (e.g. ``env.num_eval_tasks=50``). The environment must be ``household``.
- The instances: the config's held-out tasks (``env.eval_split``, ``env.task_types``, the first ``env.num_eval_tasks``,
  or the first ``--tasks``). Each household world is exported as a real ALFWorld game
  (:mod:`interq.envs.alfworld.export`, through ``AlfworldEnv(worlds=...)``) and played there under the same task id
  and goal text.
- The listing: ALFWorld lists the admissible actions in household's default order; with household's
  ``shuffle_actions`` (a fixed permutation per task and admissible set), the ALFWorld observations are listed in
  the same permuted order (:class:`ListedLikeHousehold`), so index answers name the same action in both.
- The play: the trainer's own rollout (:func:`interq.train.rl.rollout`: the config's executor, chat format, layout,
  history window, action format, turn limit) with the trainer's evaluation seeds (``10_000_019 + i``) and its
  evaluation temperature (``train.eval_temperature`` unless ``--temperature``), in chunks of ``--batch`` episodes,
  chunked the same way in both engines.
- The report: success in each engine, their difference (household minus ALFWorld) with a 95% interval from the
  paired per-instance outcomes, the per-episode outcome agreement, and the share of episodes whose whole
  trajectory (every observation the policy read and every action it took) is identical in both engines.

Why the episodes can agree one by one: the policy's input at each turn is rendered from the task text and the
observations (text and admissible actions, in order), and its sampling is seeded per episode and turn. The fidelity
check (docs/environments.md) found the two engines print the same text and list the same admissible actions along the
expert's plan and off it; where they also list them in the same order, every episode is the same token for token,
and the outcomes agree exactly. A disagreement therefore points at an engine difference, and the report names the
first one (task, turn, what each engine showed).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

EVAL_SEED0 = 10_000_019  # interq.train.rl.evaluate's seeds


@dataclass
class CrossEngineReport:
    policy: str
    config: str                    # where the settings came from
    tasks: int                     # instances played in each engine (one episode each)
    split: str
    temperature: float
    household_success: float
    alfworld_success: float
    success_diff: float            # household minus ALFWorld, paired on the same instances
    diff_ci95: tuple[float, float]  # Wald interval of the paired difference (McNemar's variance)
    discordant: int                # instances won in exactly one engine
    discordant_rate_ci95: tuple[float, float]  # Wilson interval of that share: |success_diff| is at most it
    outcome_agree: float           # share of instances with the same outcome (won or not) in both
    trajectory_agree: float        # share whose observations, actions and outcome are all identical
    household_outcomes: str        # "0"/"1" per instance, in task order
    alfworld_outcomes: str
    household_invalid_frac: float = 0.0   # share of turns whose action was unparseable or not admissible
    alfworld_invalid_frac: float = 0.0
    mean_turns: tuple[float, float] = (0.0, 0.0)  # household, ALFWorld
    first_differences: list[dict] = field(default_factory=list)
    household_seconds: float = 0.0
    alfworld_seconds: float = 0.0


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval of a proportion k/n."""
    if n == 0:
        return (0.0, 1.0)
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return (max(0.0, c - h), min(1.0, c + h))


def paired_diff(a: list[bool], b: list[bool], z: float = 1.96) -> tuple[float, tuple[float, float]]:
    """Mean of a_i - b_i and its Wald interval, variance (b10 + b01 - n d^2) / n^2 (McNemar's)."""
    n = len(a)
    if n == 0 or n != len(b):
        raise ValueError(f"paired_diff: need two outcome lists of the same non-zero length; got {len(a)} and {len(b)}")
    b10 = sum(x and not y for x, y in zip(a, b))
    b01 = sum(y and not x for x, y in zip(a, b))
    d = (b10 - b01) / n
    se = math.sqrt(max(b10 + b01 - n * d * d, 0.0)) / n
    return d, (d - z * se, d + z * se)


def _first_difference(h, a) -> dict | None:
    """Where two episodes of the same instance first differ (what the policy read, or what it did), or None."""
    for turn in range(max(h.num_turns, a.num_turns)):
        for what, xs, ys in (("observation", h.anchors, a.anchors), ("action", h.actions, a.actions)):
            x = xs[turn] if turn < len(xs) else None
            y = ys[turn] if turn < len(ys) else None
            if x != y:
                return {"task_id": h.task.task_id, "turn": turn, "what": what, "household": x, "alfworld": y}
    if (h.won, h.terminated, h.truncated) != (a.won, a.terminated, a.truncated):
        return {"task_id": h.task.task_id, "turn": h.num_turns, "what": "outcome",
                "household": {"won": h.won, "terminated": h.terminated, "truncated": h.truncated},
                "alfworld": {"won": a.won, "terminated": a.terminated, "truncated": a.truncated}}
    return None


class ListedLikeHousehold:
    """An ALFWorld env whose observations list the admissible actions in the order the household env of ``seed``
    lists them for the same task and state (household's ``shuffle_actions``: a fixed permutation per task and
    admissible set). The order is computed by household's own ``admissible_actions`` over ALFWorld's list (which is
    household's unshuffled order), so the two engines show the policy the same numbered list."""

    name = "alfworld"

    def __init__(self, inner, seed: int):
        self.inner, self.seed = inner, seed

    def _listed(self, obs):
        from dataclasses import replace
        from types import SimpleNamespace

        from interq.envs.household import HouseholdEnv

        if not obs.admissible_actions:
            return obs
        view = SimpleNamespace(_game=SimpleNamespace(admissible_commands=lambda: list(obs.admissible_actions)),
                               _task=obs.task, seed=self.seed, shuffle_actions=True)
        return replace(obs, admissible_actions=HouseholdEnv.admissible_actions(view))

    def tasks(self, split):
        return self.inner.tasks(split)

    def reset(self, task):
        return self._listed(self.inner.reset(task))

    def step(self, action):
        from dataclasses import replace

        r = self.inner.step(action)
        return replace(r, observation=self._listed(r.observation))

    def parse_action(self, generated_text):
        return self.inner.parse_action(generated_text)

    def close(self):
        self.inner.close()


def load_settings(policy_dir: str | Path, overrides: list[str] | tuple[str, ...] = ()):
    """(RunConfig, where it came from): the policy's run_config.yaml, else the demo's settings; overrides on top."""
    from interq.train.config import ConfigError, build_config, load_config, with_overrides
    from interq.train.experiments import DEMO_OVERRIDES

    path = Path(policy_dir) / "run_config.yaml"
    if path.is_file():
        cfg, where = load_config(path), str(path)
        if overrides:
            cfg = with_overrides(cfg, list(overrides))
    else:
        cfg, where = build_config("household", [*DEMO_OVERRIDES, *overrides]), "household preset + DEMO_OVERRIDES"
    if cfg.env.name != "household":
        raise ConfigError(f"env.name={cfg.env.name!r}: the cross-engine evaluation plays a household policy; "
                          "accepted: 'household'")
    return cfg, where


def cross_engine_eval(policy_dir: str | Path, num_tasks: int | None = None, temperature: float | None = None,
                      overrides: list[str] | tuple[str, ...] = (), batch: int = 16, cache_dir: str | Path | None = None,
                      policy=None, progress: bool = False) -> CrossEngineReport:
    """Play the policy on the same held-out instances in household and in ALFWorld; see the module docstring.

    ``policy``: an already loaded ``(model, tokenizer)`` to use instead of loading ``policy_dir`` (its settings are
    still read from there)."""
    import torch

    from interq.envs.alfworld import AlfworldEnv
    from interq.envs.base import TaskSpec
    from interq.rollout import RolloutEngine
    from interq.train.build import build_executor, chat_format, env_factory, split_tasks
    from interq.train.policy import load_policy
    from interq.train.rl import rollout, sampling_params

    if num_tasks is not None and (not isinstance(num_tasks, int) or isinstance(num_tasks, bool) or num_tasks < 1):
        raise ValueError(f"num_tasks must be a positive int or None; got {num_tasks!r}")
    if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
        raise ValueError(f"batch must be a positive int; got {batch!r}")
    if temperature is not None and not (isinstance(temperature, (int, float)) and temperature >= 0):
        raise ValueError(f"temperature must be a number >= 0 or None; got {temperature!r}")
    cfg, where = load_settings(policy_dir, overrides)
    make_household = env_factory(cfg.env)
    _, tasks = split_tasks(make_household, cfg.env)
    if num_tasks is not None:
        tasks = tasks[:num_tasks]
    if not tasks:
        raise ValueError(f"env.eval_split={cfg.env.eval_split!r} has no held-out tasks for env.task_types="
                         f"{cfg.env.task_types!r}")
    hh = make_household()
    worlds = [hh.world(t) for t in tasks]
    max_steps, shuffled, seed = hh.max_steps, bool(getattr(hh, "shuffle_actions", False)), hh.seed
    hh.close()

    tmp = None
    if cache_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="interq-cross-engine-")
        cache_dir = tmp.name

    def make_alfworld():
        env = AlfworldEnv(worlds=worlds, cache_dir=cache_dir, max_steps=max_steps, expert=False)
        return ListedLikeHousehold(env, seed) if shuffled else env

    alf_tasks = [TaskSpec("alfworld", t.task_id, t.split, t.task_type, t.description) for t in tasks]
    model, tokenizer = policy if policy is not None else load_policy(policy_dir, "float32")
    fmt = chat_format(tokenizer)
    ex = build_executor(model, cfg.rollout)
    engine = RolloutEngine(ex.module, cache_factory=ex.cache_factory, pad_token_id=fmt.pad_token_id,
                           max_context_tokens=cfg.rollout.max_context_tokens, info=ex.info)
    temp = cfg.train.eval_temperature if temperature is None else float(temperature)
    sp = sampling_params(cfg, fmt, temp)
    seeds = [EVAL_SEED0 + i for i in range(len(tasks))]
    eps: dict[str, list] = {"household": [], "alfworld": []}
    secs = {"household": 0.0, "alfworld": 0.0}
    try:
        with torch.no_grad():
            for lo in range(0, len(tasks), batch):
                hi = min(lo + batch, len(tasks))
                for name, mk, ts in (("household", make_household, tasks), ("alfworld", make_alfworld, alf_tasks)):
                    t0 = time.perf_counter()
                    eps[name] += rollout(engine, fmt, mk, ts[lo:hi], seeds[lo:hi], list(range(lo, hi)), sp, cfg)
                    secs[name] += time.perf_counter() - t0
                if progress:
                    won = {k: sum(e.won for e in v) for k, v in eps.items()}
                    print(f"[cross-engine] {hi}/{len(tasks)} instances: won household {won['household']}, "
                          f"alfworld {won['alfworld']} ({secs['household']:.0f} s / {secs['alfworld']:.0f} s)",
                          file=sys.stderr, flush=True)
    finally:
        if tmp is not None:
            tmp.cleanup()
    h_won = [e.won for e in eps["household"]]
    a_won = [e.won for e in eps["alfworld"]]
    n = len(tasks)
    diff, ci = paired_diff(h_won, a_won)
    disc = sum(x != y for x, y in zip(h_won, a_won))
    def invalid(es):
        return sum(1 - v for e in es for v in e.valid) / max(sum(e.num_turns for e in es), 1)

    firsts = [d for h, a in zip(eps["household"], eps["alfworld"]) if (d := _first_difference(h, a)) is not None]
    return CrossEngineReport(
        policy=str(policy_dir), config=where, tasks=n, split=cfg.env.eval_split, temperature=temp,
        household_success=sum(h_won) / n, alfworld_success=sum(a_won) / n, success_diff=diff, diff_ci95=ci,
        discordant=disc, discordant_rate_ci95=wilson(disc, n), outcome_agree=1 - disc / n,
        trajectory_agree=1 - len(firsts) / n,
        household_outcomes="".join("1" if w else "0" for w in h_won),
        alfworld_outcomes="".join("1" if w else "0" for w in a_won),
        household_invalid_frac=invalid(eps["household"]), alfworld_invalid_frac=invalid(eps["alfworld"]),
        mean_turns=(sum(e.num_turns for e in eps["household"]) / n, sum(e.num_turns for e in eps["alfworld"]) / n),
        first_differences=firsts[:10], household_seconds=secs["household"], alfworld_seconds=secs["alfworld"])


def summary(r: CrossEngineReport) -> str:
    lo, hi = r.diff_ci95
    dlo, dhi = r.discordant_rate_ci95
    return (f"{r.tasks} held-out instances ({r.split}), T={r.temperature:g}: success household {r.household_success:.3f}, "
            f"ALFWorld {r.alfworld_success:.3f}; difference {r.success_diff:+.3f} (95% paired interval "
            f"[{lo:+.3f}, {hi:+.3f}]); outcomes agree on {r.outcome_agree:.1%} of instances ({r.discordant} discordant, "
            f"discordance 95% Wilson [{dlo:.3f}, {dhi:.3f}]); whole trajectories identical on {r.trajectory_agree:.1%}; "
            f"{r.household_seconds:.0f} s household, {r.alfworld_seconds:.0f} s ALFWorld")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("policy", help="a policy directory (config.json + model.safetensors + tokenizer)")
    ap.add_argument("overrides", nargs="*", help="config overrides key.sub=value")
    ap.add_argument("--tasks", type=int, default=None, help="play the first N held-out instances (default: all)")
    ap.add_argument("--temperature", type=float, default=None, help="sampling temperature (default train.eval_temperature)")
    ap.add_argument("--batch", type=int, default=16, help="episodes played at once in each engine")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    ap.add_argument("--json", default=None, help="also write the full report here")
    args = ap.parse_intermixed_args(argv)  # overrides may come before or after the options
    import torch

    from interq.machine import describe, load_avg, machine_info

    torch.set_num_threads(args.threads)
    machine = machine_info()
    print(f"machine: {describe(machine)}", file=sys.stderr, flush=True)
    rep = cross_engine_eval(args.policy, args.tasks, args.temperature, args.overrides, batch=args.batch, progress=True)
    print(summary(rep))
    for d in rep.first_differences[:3]:
        print(f"  first difference: {json.dumps(d)[:400]}")
    out = {**asdict(rep), "machine": {**machine, "load_avg_end": load_avg()}}
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    print("RESULT " + json.dumps({k: v for k, v in out.items() if k != "first_differences"}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
