"""Where a study run's CPU time goes, and its learner's two ways of packing a step's rows, side by side.

One study step on this machine (``interq compare --setting study-1k --regimes matched``: the tiny household policy
writing its actions, 8 tasks x 8 episodes a step, a W4A4-KV4 executor), starting from ``--policy`` (default the
shipped warm start of that setting, ``interq/policies/household_text``):

- ``rollout_cpu_s``: CPU seconds of one step's 64 training episodes (``interq.train.rl.rollout``);
- the learner's update (``interq.train.rl.update``) of that step's batch, in interleaved rounds (median CPU seconds):
  ``packed_rows`` (every row of a pack computed, one forward padded to its longest row, packs of at most
  ``--baseline-tokens`` rows x width: how the learner ran before it computed distinct rows) and ``distinct_rows``
  (the current code: each distinct row once, in length buckets, packs of ``--tokens`` computed tokens); their
  ``learner_speedup``, and the relative difference of the two fp32 gradients (``grad_rel_diff``: float rounding);
- ``eval_cpu_s_per_episode``: one held-out episode's CPU seconds (``--eval-episodes`` of them);
- a 200-step study run extrapolated from these: 200 x (rollout + learner) + 5 evaluations of 1,000 episodes, in
  CPU seconds and runs per CPU-hour, with either learner (``runs_per_cpu_hour_before`` / ``_after``).

Single-threaded like a study run (``train.threads=1``). The RESULT line records the machine
(``interq.machine.machine_info()`` at the start, ``load_avg_end`` at the end): compare the ratios, not the seconds.

    .venv/bin/python benchmarks/bench_study_step.py [--arm q-interq] [--rounds 3] [--eval-episodes 100]
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from importlib import resources
from types import SimpleNamespace

import torch

from interq.machine import describe, load_avg, machine_info
from interq.train import rl
from interq.train.build import build_executor, chat_format, env_factory, split_tasks
from interq.train.config import with_overrides
from interq.train.experiments import REGIMES, SETTINGS, arm_config
from interq.train.policy import load_policy

STUDY_STEPS, STUDY_EVALS, STUDY_EVAL_EPISODES = 200, 5, 1000  # a study-1k run: evaluations at 0, 50, ..., 200


def rollout_setup(cfg, policy: str) -> SimpleNamespace:
    """What a run of ``cfg`` from the policy directory ``policy`` plays with, built as ``interq.train.rl.train``
    builds it: ``model``, ``fmt``, ``make_env``, ``train_tasks``, ``eval_tasks``, ``executor``, ``engine``."""
    from interq.rollout import RolloutEngine

    model, tokenizer = load_policy(policy, cfg.model.dtype)
    make_env = env_factory(cfg.env)
    train_tasks, eval_tasks = split_tasks(make_env, cfg.env, {})
    fmt = chat_format(tokenizer)
    executor = build_executor(model, cfg.rollout)
    engine = RolloutEngine(executor.module, cache_factory=executor.cache_factory, pad_token_id=fmt.pad_token_id,
                           max_context_tokens=cfg.rollout.max_context_tokens, info=executor.info)
    return SimpleNamespace(model=model, fmt=fmt, make_env=make_env, train_tasks=train_tasks, eval_tasks=eval_tasks,
                           executor=executor, engine=engine)


def packed_rows(batch, row_subset: list[int], tokens_per_microbatch: int) -> list[list[int]]:
    """The baseline packing: whole episodes in order while rows x longest row <= ``tokens_per_microbatch``."""
    lengths = batch.attention_mask.sum(-1).tolist()
    by_ep: dict[int, list[int]] = {}
    for r in row_subset:
        by_ep.setdefault(batch.row_episode[r], []).append(r)
    out, cur, width = [], [], 0
    for rows in by_ep.values():
        w = max(width, *(lengths[r] for r in rows))
        if cur and (len(cur) + len(rows)) * w > tokens_per_microbatch:
            out.append(cur)
            cur, w = [], max(lengths[r] for r in rows)
        cur, width = cur + rows, w
    if cur:
        out.append(cur)
    return out


def padded_logprobs(model, mb: dict, batch) -> torch.Tensor:
    """The baseline forward: every row of the pack, padded to its longest."""
    from interq.rollout import sequence_logprobs

    return sequence_logprobs(model, mb["input_ids"], mb["attention_mask"], temperature=batch.temperature,
                             top_p=batch.top_p, score_mask=mb["action_mask"])


def timed_update(cfg, model, state, qcfg, batch, baseline: bool) -> tuple[float, torch.Tensor]:
    """CPU seconds of one update from ``state``, and the gradient it applied (an SGD step of lr 1)."""
    current = rl.micro_batches, rl._sequence_logprobs
    if baseline:
        rl.micro_batches, rl._sequence_logprobs = packed_rows, padded_logprobs
    try:
        model.load_state_dict(state)
        learner = rl.Learner(model, cfg, qcfg)
        learner.optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
        t0 = time.process_time()
        rl.update(learner, batch, cfg, 1)
        dt = time.process_time() - t0
    finally:
        rl.micro_batches, rl._sequence_logprobs = current
    grad = torch.cat([(state[n] - p.detach()).flatten() for n, p in model.named_parameters()])
    return dt, grad


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arm", default="q-interq")
    p.add_argument("--policy", default=None, help="warm-started policy (default: the shipped household_text one)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--tokens", type=int, default=None, help="distinct_rows packs (default: the setting's)")
    p.add_argument("--baseline-tokens", type=int, default=4096, help="packed_rows packs (rows x width)")
    p.add_argument("--eval-episodes", type=int, default=100)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    info = machine_info()
    print(describe(info), flush=True)
    cfg = arm_config(args.arm, [*SETTINGS["study-1k"], *REGIMES["matched"], "train.progress=false"])
    tokens = args.tokens or cfg.train.tokens_per_microbatch
    policy = args.policy or str(resources.files("interq") / "policies" / "household_text")
    run = rollout_setup(cfg, policy)
    model, fmt, make_env, train_tasks, eval_tasks = run.model, run.fmt, run.make_env, run.train_tasks, run.eval_tasks
    executor, engine = run.executor, run.engine
    tasks, seeds, groups = rl.step_tasks(train_tasks, cfg, 1)
    t0 = time.process_time()
    episodes = rl.rollout(engine, fmt, make_env, tasks, seeds, groups, rl.sampling_params(cfg, fmt), cfg)
    rollout_s = time.process_time() - t0
    batch = rl.build_batch(episodes, cfg.algo, fmt.pad_token_id)
    t0 = time.process_time()
    ev = dict(cfg=with_overrides(cfg, [f"env.num_eval_tasks={args.eval_episodes}"]))
    rl.evaluate(engine, fmt, make_env, eval_tasks[: args.eval_episodes], ev["cfg"])
    eval_s = (time.process_time() - t0) / args.eval_episodes
    fp32 = with_overrides(cfg, ["train.learner_autocast=off"])
    arms = {"packed_rows": (with_overrides(cfg, [f"train.tokens_per_microbatch={args.baseline_tokens}"]), True),
            "distinct_rows": (with_overrides(cfg, [f"train.tokens_per_microbatch={tokens}"]), False)}
    state = copy.deepcopy(model.state_dict())
    times: dict[str, list[float]] = {k: [] for k in arms}
    for rnd in range(args.rounds):
        for name, (c, baseline) in arms.items():
            times[name].append(timed_update(c, model, state, executor.qcfg, batch, baseline)[0])
        print(f"round {rnd}: " + ", ".join(f"{k} {v[-1]:.2f}s" for k, v in times.items()), flush=True)
    grads = [timed_update(with_overrides(fp32, [f"train.tokens_per_microbatch={c.train.tokens_per_microbatch}"]),
                          model, state, executor.qcfg, batch, baseline)[1] for c, baseline in arms.values()]
    model.load_state_dict(state)
    learner = {k: statistics.median(v) for k, v in times.items()}
    lengths = batch.attention_mask.sum(-1)
    keys = rl.row_keys(batch.input_ids, batch.action_mask, batch.attention_mask)
    run = {k: STUDY_STEPS * (rollout_s + v) + STUDY_EVALS * STUDY_EVAL_EPISODES * eval_s for k, v in learner.items()}
    res = {"arm": args.arm, "rows": int(lengths.numel()), "tokens": int(lengths.sum()),
           "distinct_row_share": round(len(set(keys)) / len(keys), 3),
           "rollout_cpu_s": round(rollout_s, 3), "eval_cpu_s_per_episode": round(eval_s, 4),
           "learner_cpu_s": {k: round(v, 3) for k, v in learner.items()},
           "learner_speedup": round(learner["packed_rows"] / learner["distinct_rows"], 2),
           "grad_rel_diff": float(f"{float((grads[1] - grads[0]).norm() / grads[0].norm()):.2e}"),
           "tokens_per_pack": {"packed_rows": args.baseline_tokens, "distinct_rows": tokens},
           "study_run_cpu_s": {k: round(v) for k, v in run.items()},
           "runs_per_cpu_hour_before": round(3600 / run["packed_rows"], 2),
           "runs_per_cpu_hour_after": round(3600 / run["distinct_rows"], 2),
           "run_speedup": round(run["packed_rows"] / run["distinct_rows"], 2),
           "machine": {**info, "load_avg_end": load_avg()}}
    print("RESULT " + json.dumps(res))
    return res


if __name__ == "__main__":
    main()
