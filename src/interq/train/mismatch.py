"""``interq mismatch``: how far the learner's log-probs sit from the executor's, turn by turn.

Given a policy, an environment and an executor configuration (the preset's ``rollout.*``), it

1. plays episodes with the executor exactly as training steps 1, 2, ... would sample them (``rl.step_tasks``,
   ``rl.rollout``: the same tasks, seeds and batching), and lays them out with ``rl.build_batch``;
2. recomputes the learner's log-probs on those exact tokens with the trainer's proximal pass
   (``rl.proximal_logprobs``, with the run's ``train.learner_autocast``, ``train.learner_gemm`` and
   ``train.learner_attention``): the plain
   learner (``model.dtype``) and, for a ``w8a8`` executor, the aligned (quantized-like, ``interq.quant.aligned``)
   learner;
3. reads the profile off the trainer's own functions: ``interq.algo.corrections.compute_correction("interq", ...)``
   (the §7 metrics ``mismatch/*``, ``interq/*`` and the ``turn/<curve>/<t>`` accumulation curves) and
   ``interq_turn_profile`` (signed delta, budget binding, effective support and counts per turn).

So the numbers agree with a training step's ``metrics.jsonl`` by construction (``tests/test_train_mismatch.py``
checks it to 1e-6 on the episodes of a ``train.steps=1`` run). No training, no optimizer. The headline numbers
use the learner the arm trains with: aligned when ``algo.align``, else plain. |Lambda| is InterQ's (spec §3) at
``--budget`` (default ``algo.budget``) whatever the arm's correction, so any arm shows what InterQ would do.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from pathlib import Path

import torch

from interq import rundir
from interq.machine import describe, load_avg, machine_info
from interq.train import rl
from interq.train.config import ConfigError, RunConfig, build_config, save_config
from interq.train.experiments import REGIMES, SETTINGS
from interq.train.policy import check_policy_dir

# ---------------------------------------------------------------------------------------------- the profile


def episode_plan(train_tasks, cfg: RunConfig, episodes: int) -> list[tuple[list, list[int], list[int]]]:
    """The trainer's task sampling of steps 1, 2, ... (``rl.step_tasks``) until ``episodes`` episodes:
    one (tasks, seeds, groups) batch per step, groups numbered across the steps. The last step is cut short."""
    t = cfg.train
    plan, left, step, g0 = [], episodes, 1, 0
    while left > 0:
        c = cfg
        if left < t.tasks_per_step * t.episodes_per_task:
            c = dataclasses.replace(cfg, train=dataclasses.replace(t, tasks_per_step=math.ceil(left / t.episodes_per_task)))
        tasks, seeds, groups = rl.step_tasks(train_tasks, c, step)
        tasks, seeds, groups = tasks[:left], seeds[:left], groups[:left]
        plan.append((tasks, seeds, [g0 + g for g in groups]))
        g0 += max(groups) + 1
        left -= len(tasks)
        step += 1
    return plan


class _StepCounter:
    """A pass-through environment that reports each ``step`` (progress lines while a long batch plays)."""

    def __init__(self, env, on_step) -> None:
        self._env, self._on_step = env, on_step

    def step(self, action):
        out = self._env.step(action)
        self._on_step()
        return out

    def __getattr__(self, name):
        return getattr(self._env, name)


def profile_metrics(proximal: torch.Tensor, batch: rl.Batch, cfg: RunConfig, budget: float) -> dict[str, float]:
    """The flat metrics of one learner's log-probs on the batch: ``compute_correction("interq")``'s (spec §7 names,
    as the trainer logs them) plus ``interq_turn_profile``'s per-turn curves. proximal [B, L]."""
    from interq.algo.corrections import compute_correction, interq_turn_profile

    ccfg = dataclasses.replace(rl.correction_config(cfg.algo), budget=budget)
    corr = compute_correction("interq", proximal, batch.behavior_logprobs, batch.action_mask,
                              traj_id=batch.traj_id, turn_idx=batch.turn_idx, config=ccfg)
    extra = interq_turn_profile(proximal, batch.behavior_logprobs, batch.action_mask, budget,
                                traj_id=batch.traj_id, turn_idx=batch.turn_idx)
    return {**corr.metrics, **extra}


def summarize_metrics(m: dict[str, float]) -> dict:
    """Headline scalars and per-turn lists (index t - 1) of one learner's flat metrics."""
    from interq.algo.metrics import turn_curve

    return {
        "abs_delta_mean": m["mismatch/abs_delta_mean"],
        "signed_delta_mean": -m["mismatch/k1"],  # k1 = mean(behavior - proximal): delta = -k1
        "k3": m["mismatch/k3"],
        "nonfinite_frac": m["mismatch/nonfinite_frac"],
        "budget_bound_frac": m.get("interq/budget_bound_frac", 0.0),
        "effective_support_mean": m.get("interq/support_mean", 0.0),
        "lambda_abs_mean": m.get("interq/lambda_abs_mean", 0.0),
        "abs_delta_mean_by_turn": turn_curve(m, "abs_delta_mean"),
        "signed_delta_mean_by_turn": turn_curve(m, "signed_delta_mean"),
        "abs_prefix_logratio_by_turn": turn_curve(m, "abs_prefix_logratio"),
        "abs_lambda_by_turn": turn_curve(m, "abs_Lambda"),
        "budget_bound_frac_by_turn": turn_curve(m, "budget_bound_frac"),
        "effective_support_by_turn": turn_curve(m, "support_mean"),
        "turns_by_turn": [int(x) for x in turn_curve(m, "turns")],
        "action_tokens_by_turn": [int(x) for x in turn_curve(m, "action_tokens")],
    }


def executor_description(cfg: RunConfig, qcfg=None) -> dict:
    r = cfg.rollout
    if r.executor != "w8a8":
        return {"executor": r.executor, "w_format": r.executor, "a_format": r.executor, "kv_format": r.executor,
                "w_bits": None, "a_bits": None, "kv_bits": None}
    w_format = qcfg.w_format if qcfg is not None else r.weight_format
    return {"executor": "w8a8", "dtype": r.executor_dtype, "w_format": w_format,
            "a_format": "int8" if w_format == "int8" else w_format,  # the activations of the GEMMs follow the weights
            "kv_format": qcfg.kv_format if qcfg is not None else r.kv_format,
            **{k: getattr(qcfg, k, getattr(r, k, 8)) for k in ("w_bits", "a_bits", "kv_bits")}}


def mismatch_profile(model, tokenizer, cfg: RunConfig, tasks, *, episodes: int = 32, budget: float | None = None,
                     log=print) -> dict:
    """Play ``episodes`` episodes of ``tasks`` (the train split, sampled as the trainer does) with the executor built
    from ``cfg.rollout``, recompute the learner's log-probs, and return the per-turn profile of each learner.

    Returns ``{"learners": {"plain": {...}, "aligned": {...}}, "learner": <headline>, <headline learner's scalars and
    lists>, "episodes", "tokens", "turns", "budget", "executor", "rollout", "time"}``; each learner's entry is
    ``summarize_metrics`` of its flat metrics plus ``"metrics"`` (the flat dict, trainer names).
    """
    from interq.rollout import RolloutEngine
    from interq.train.build import build_executor, chat_format, env_factory

    if episodes <= 0:
        raise ValueError(f"episodes={episodes} must be > 0")
    budget = cfg.algo.budget if budget is None else float(budget)
    t0 = time.perf_counter()
    fmt = chat_format(tokenizer)
    executor = build_executor(model, cfg.rollout)
    engine = RolloutEngine(executor.module, cache_factory=executor.cache_factory, pad_token_id=fmt.pad_token_id,
                           max_context_tokens=cfg.rollout.max_context_tokens, info=executor.info)
    make_env = env_factory(cfg.env)
    sampling = rl.sampling_params(cfg, fmt)
    plan = episode_plan(tasks, cfg, episodes)
    desc = executor_description(cfg, executor.qcfg)
    log(f"[mismatch] playing {episodes} episodes with the {desc['executor']} executor, as training steps 1..{len(plan)} "
        "would sample them")
    played = []
    for step, (ts, seeds, groups) in enumerate(plan, start=1):
        ts0 = time.perf_counter()
        turns, last = [0], [ts0]

        def on_step() -> None:  # a line every 30 s while a batch plays (SmolLM2 on a CPU: minutes)
            turns[0] += 1
            if time.perf_counter() - last[0] >= 30:
                last[0] = time.perf_counter()
                log(f"[mismatch] step-{step} tasks: {turns[0]} turns played (at most {len(ts) * cfg.env.max_turns}; "
                    f"{last[0] - ts0:.0f}s)")

        eps = rl.rollout(engine, fmt, lambda: _StepCounter(make_env(), on_step), ts, seeds, groups, sampling, cfg)
        played += eps
        log(f"[mismatch] step-{step} tasks: {len(eps)} episodes, {sum(e.num_turns for e in eps)} turns, "
            f"success {sum(e.won for e in eps) / len(eps):.2f} ({time.perf_counter() - ts0:.1f}s; "
            f"{len(played)}/{episodes})")
    batch = rl.build_batch(played, cfg.algo, fmt.pad_token_id)
    play_s = time.perf_counter() - t0
    variants = ["plain"] + (["aligned"] if cfg.rollout.executor == "w8a8" else [])
    learners, learner_s = {}, {}
    for name in variants:
        tl = time.perf_counter()
        proximal = rl.proximal_logprobs(model, batch, cfg.train.tokens_per_microbatch, name == "aligned",
                                        executor.qcfg, cfg.train.learner_autocast, cfg.train.learner_gemm,
                                        cfg.train.learner_attention)  # [B, L]
        m = profile_metrics(proximal, batch, cfg, budget)
        learners[name] = {**summarize_metrics(m), "metrics": m}
        learner_s[name] = time.perf_counter() - tl
        s = learners[name]
        log(f"[mismatch] {name} learner: mean |delta| {s['abs_delta_mean']:.4g}, signed {s['signed_delta_mean']:+.4g}, "
            f"budget binds on {s['budget_bound_frac']:.1%} of turns ({learner_s[name]:.1f}s)")
    head = "aligned" if cfg.algo.align and "aligned" in learners else "plain"
    headline = {k: v for k, v in learners[head].items() if k != "metrics"}
    return {
        **headline,
        "learner": head,
        "learners": learners,
        "episodes": len(played),
        "tokens": int(batch.action_mask.sum()),
        "context_tokens": int(batch.attention_mask.sum()),
        "rows": int(batch.input_ids.shape[0]),
        "turns": len(headline["abs_prefix_logratio_by_turn"]),
        "budget": budget,
        "correction_of_arm": cfg.algo.correction,
        "layout": cfg.algo.layout,
        "executor": desc,
        "rollout": rl.episode_stats(played, "rollout"),
        "time": {"play_s": play_s, **{f"{k}_learner_s": v for k, v in learner_s.items()}},
    }


# ---------------------------------------------------------------------------------------------- report


def _f(x: float) -> str:
    return f"{x:.4g}" if abs(x) >= 1e-3 or x == 0 else f"{x:.2e}"


def markdown_report(profile: dict, header: str = "") -> str:
    """One per-turn table per learner (the headline learner first)."""
    b = profile["budget"]
    out = [header] if header else []
    order = [profile["learner"]] + [k for k in profile["learners"] if k != profile["learner"]]
    for name in order:
        s = profile["learners"][name]
        tag = " (headline: the arm trains with it)" if name == profile["learner"] else ""
        out.append(f"### {name} learner{tag}\n")
        out.append(f"| turn t | turns | action tokens | mean abs delta | signed mean delta | abs raw prefix log-ratio | "
                   f"abs Lambda (B={b:g}) | budget binds | effective support |\n|---|---|---|---|---|---|---|---|---|")
        for i in range(len(s["abs_prefix_logratio_by_turn"])):
            lam = s["abs_lambda_by_turn"][i] if i < len(s["abs_lambda_by_turn"]) else 0.0
            out.append(f"| {i + 1} | {s['turns_by_turn'][i]} | {s['action_tokens_by_turn'][i]} | "
                       f"{_f(s['abs_delta_mean_by_turn'][i])} | {_f(s['signed_delta_mean_by_turn'][i])} | "
                       f"{_f(s['abs_prefix_logratio_by_turn'][i])} | {_f(lam)} | "
                       f"{s['budget_bound_frac_by_turn'][i]:.1%} | {s['effective_support_by_turn'][i]:.3f} |")
        out.append(f"| all | {sum(s['turns_by_turn'])} | {sum(s['action_tokens_by_turn'])} | {_f(s['abs_delta_mean'])} | "
                   f"{_f(s['signed_delta_mean'])} | | {_f(s['lambda_abs_mean'])} | {s['budget_bound_frac']:.1%} | "
                   f"{s['effective_support_mean']:.3f} |\n")
    return "\n".join(out)


def plot_profile(profile: dict, path: str | Path, title: str = "") -> None:
    """Left: |raw prefix log-ratio| and InterQ's |Lambda| vs turn, the budget line (log scale when every curve sits
    far below the budget). Right: mean |delta| per action token vs turn. One colour per learner."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    b = profile["budget"]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    top = 0.0
    for (name, s), color in zip(profile["learners"].items(), ("tab:blue", "tab:red")):
        t = range(1, len(s["abs_prefix_logratio_by_turn"]) + 1)
        ax.plot(t, s["abs_prefix_logratio_by_turn"], marker="o", color=color, label=f"{name}: |raw prefix log-ratio|")
        ax.plot(t, s["abs_lambda_by_turn"], marker="s", ls="--", color=color, alpha=0.7, label=f"{name}: |Lambda| (InterQ)")
        ax2.plot(t, s["abs_delta_mean_by_turn"], marker="o", color=color, label=f"{name} learner")
        top = max(top, *s["abs_prefix_logratio_by_turn"], *s["abs_lambda_by_turn"])
    if math.isfinite(b):
        ax.axhline(b, color="grey", ls=":", label=f"budget B = {b:g}")
    if 0 < top < b / 10:
        ax.set_yscale("symlog", linthresh=max(top / 100, 1e-8))
    ax.set(xlabel="turn t", ylabel="nats (mean over trajectories)", title=title or "mismatch accumulation along the history")
    ax2.set(xlabel="turn t", ylabel="mean |delta| per action token", title="token mismatch per turn")
    for a in (ax, ax2):
        a.xaxis.set_major_locator(MaxNLocator(integer=True))
        a.grid(alpha=0.3)
        a.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _round(x):
    if isinstance(x, float):
        return float(f"{x:.6g}")  # six significant digits: the deltas of a good executor are ~1e-4
    if isinstance(x, list):
        return [_round(v) for v in x]
    if isinstance(x, dict):
        return {k: _round(v) for k, v in x.items()}
    return x


# ---------------------------------------------------------------------------------------------- command


def _fail(msg: str) -> None:
    print(f"interq: invalid configuration: {msg}", file=sys.stderr)
    raise SystemExit(2)


@rundir.command("mismatch")  # --out is checked and locked below, once the config names it
def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="interq mismatch",
        description="play episodes with the arm's executor, recompute the learner's log-probs on them (plain and "
                    "aligned), report the per-turn mismatch profile (mean |delta|, prefix log-ratio, InterQ's |Lambda|, "
                    "budget binding, effective support); no training. Ends with RESULT {json}.")
    from interq.train.cli_args import add_config_arguments, print_config_help

    add_config_arguments(p)  # --preset (default q-interq), --help-config [SECTION], --force
    p.add_argument("--policy", default=None, help="policy or checkpoint directory (default: the preset's policy, "
                   "warm-started into <out>/warm_start, reused when made from the same inputs)")
    p.add_argument("--episodes", type=int, default=32, help="episodes to play (default 32), sampled as training steps "
                   "1, 2, ... sample theirs (train.tasks_per_step x train.episodes_per_task per step)")
    p.add_argument("--budget", type=float, default=None, help="InterQ budget B for |Lambda| (default: algo.budget)")
    p.add_argument("--out", default=None, help="output directory (default: runs/mismatch/<name>)")
    p.add_argument("--fresh", action="store_true", help="move a warm start in --out that was made from other inputs "
                   "aside to <dir>.stale-<time> and make it again (default: stop and name every differing field)")
    p.add_argument("--setting", default="none", choices=sorted(SETTINGS), help="built-in overrides applied first, as "
                   "in interq compare: demo (the demo's settings), study (the comparison study's: text actions), "
                   "study-index (its first setting: the action's number), none (default)")
    p.add_argument("--regime", default=None, choices=sorted(REGIMES), help="the executor regime of interq compare, "
                   "applied after --setting: natural (the preset's W8A8-KV8) or matched (W4A4-KV4); default: none")
    p.add_argument("overrides", nargs="*", help="key.sub=value overrides, e.g. rollout.kv_format=fp8_per_token_head")
    args = p.parse_args(argv)
    if args.help_config is not None:
        return print_config_help(args.help_config, args.preset)
    overrides = [*SETTINGS[args.setting], *REGIMES.get(args.regime, []), *args.overrides]

    # everything is validated before any work
    t0 = time.perf_counter()
    if args.episodes <= 0:
        _fail(f"--episodes={args.episodes} is not accepted; it must be > 0")
    if args.budget is not None and not args.budget >= 0:
        _fail(f"--budget={args.budget} is not accepted; it must be >= 0 (nats, inf allowed)")
    try:
        cfg = build_config(args.preset, overrides)
    except ConfigError as e:
        _fail(str(e))
    try:
        if args.policy is not None:
            check_policy_dir(args.policy, "--policy")
        elif cfg.model.source != "tiny":
            check_policy_dir(cfg.model.source, "model.source")
    except ConfigError as e:
        _fail(str(e))
    from interq.train.build import env_factory, split_tasks

    try:
        train_tasks, _ = split_tasks(env_factory(cfg.env), cfg.env)
    except (ConfigError, TypeError, ValueError) as e:  # e.g. env.env_kwargs the environment does not take
        _fail(f"env.name={cfg.env.name!r} / env.env_kwargs={cfg.env.env_kwargs}: {e}" if not isinstance(e, ConfigError) else str(e))
    if args.policy is None and (cfg.model.source == "tiny" or (cfg.warm_start.enabled and cfg.warm_start.steps > 0)):
        print(f"[mismatch] no --policy: this first warm-starts {cfg.model.source} ({cfg.warm_start.steps} steps of "
              f"fine-tuning into <out>/warm_start, reused when made from the same inputs), then measures; --policy DIR "
              "measures a policy as it is", flush=True)

    from interq.train.pipeline import _quiet_transformers, prepare_policy
    from interq.train.policy import load_policy

    _quiet_transformers()
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    machine = machine_info()  # interq.machine's record at the start; load_avg_end and wall_s at the end
    out = Path(args.out or f"runs/mismatch/{cfg.name}")
    rundir.enter(out, "mismatch", args.force)  # refused before any work if unusable or another writer's
    out.mkdir(parents=True, exist_ok=True)
    if args.policy is not None:
        policy = args.policy
    elif cfg.model.source == "tiny" or (cfg.warm_start.enabled and cfg.warm_start.steps > 0):
        policy, summary = prepare_policy(cfg, out / "warm_start", fresh=args.fresh)
        print(f"[warm start] policy {summary['policy']} in {summary.get('seconds', 0):.0f}s", flush=True)
    else:
        policy = cfg.model.source
    model, tokenizer = load_policy(policy, cfg.model.dtype)
    log = lambda msg: print(msg, flush=True)  # noqa: E731
    prof = mismatch_profile(model, tokenizer, cfg, train_tasks, episodes=args.episodes, budget=args.budget, log=log)
    wall = time.perf_counter() - t0
    machine.update({"load_avg_end": load_avg(), "wall_s": wall})
    cmd = "interq mismatch " + " ".join(argv)
    e = prof["executor"]
    bits = "" if e.get("w_bits") is None else f", W{e['w_bits']}A{e['a_bits']}-KV{e['kv_bits']}"
    header = (f"Command: `{cmd}`\n\nPolicy `{policy}`; {prof['episodes']} episodes, {prof['tokens']} action tokens, "
              f"{prof['turns']} turns max; executor {e['executor']} (w {e['w_format']}, a {e['a_format']}, kv "
              f"{e['kv_format']}{bits}); InterQ budget B = {prof['budget']:g}; {cfg.algo.layout} rows; rollout success "
              f"{prof['rollout']['rollout/success']:.3f}; {describe(machine)}; load {machine['load_avg_end']} at the end; {wall:.0f}s.\n")
    table = markdown_report(prof, header)
    (out / "mismatch.md").write_text(table)
    plot_profile(prof, out / "mismatch.png", f"{cfg.name}: {e['executor']}{bits} executor, {prof['episodes']} episodes")
    save_config(cfg, out / "config.yaml")
    (out / "mismatch.json").write_text(json.dumps({**prof, "policy": str(policy), "command": cmd, "machine": machine},
                                                  indent=1, default=str))
    print(table)
    print(f"table {out / 'mismatch.md'}, plot {out / 'mismatch.png'}, profile {out / 'mismatch.json'}")
    result = {k: v for k, v in prof.items() if k not in ("learners", "rollout", "time")}
    result.update({"policy": str(policy), "machine": machine, "time": prof["time"],
                   "rollout_success": prof["rollout"]["rollout/success"],
                   "by_learner": {k: {x: y for x, y in v.items() if x != "metrics"} for k, v in prof["learners"].items()}})
    print("RESULT " + json.dumps(_round(result), sort_keys=True, default=str))
    return 0
