"""Why a household policy fails: held-out episodes classified by what happened (won / took a wrong object / took the
right object but did not place it / never took anything), plus the expert's success and length on the same tasks.

    .venv/bin/python scripts/household_failures.py POLICY_DIR [key.sub=value ...]

Uses the small index-answer settings (``interq.train.experiments.STUDY_BASE_OVERRIDES``) plus the overrides; plays the evaluation
split with the trainer's own rollout (bf16 executor) at T = 0.5 and 1.0 with the evaluation seeds.
"""

import collections
import sys

import torch

from interq.agent.loop import make_render
from interq.rollout import RolloutEngine
from interq.train.build import build_executor, chat_format, collect_demos, env_factory, split_tasks
from interq.train.config import build_config
from interq.train.experiments import STUDY_BASE_OVERRIDES
from interq.train.policy import load_policy
from interq.train.rl import rollout, sampling_params


def main(argv: list[str]) -> None:
    torch.set_num_threads(1)
    cfg = build_config("household", [*STUDY_BASE_OVERRIDES, *argv[1:]])
    make_env = env_factory(cfg.env)
    _, tasks = split_tasks(make_env, cfg.env)
    demos = collect_demos(make_env, tasks, len(tasks), 0.0, 0, cfg.env.max_turns, "per_turn", 1, make_render(True, True), True)
    wins = [len(d.actions) for d in demos if d.won]
    print(f"expert: success {len(wins) / len(demos):.2f}, mean length of wins {sum(wins) / max(len(wins), 1):.1f} turns")
    model, tokenizer = load_policy(argv[0], "float32")
    fmt = chat_format(tokenizer)
    ex = build_executor(model, cfg.rollout)
    engine = RolloutEngine(ex.module, cache_factory=ex.cache_factory, pad_token_id=fmt.pad_token_id,
                           max_context_tokens=cfg.rollout.max_context_tokens, info=ex.info)
    for temperature in (0.5, 1.0):
        seeds = [10_000_019 + i for i in range(len(tasks))]  # the evaluation seeds of interq.train.rl.evaluate
        eps = rollout(engine, fmt, make_env, tasks, seeds, list(range(len(tasks))), sampling_params(cfg, fmt, temperature), cfg)
        kinds = collections.Counter()
        for ep in eps:
            goal = ep.task.description.split(" ")[2]  # "put a(n)/some <object> in/on <receptacle>."
            takes = [a.split(" ")[1] for a in ep.actions if a.startswith("take ")]
            kinds["won" if ep.won else "took a wrong object" if any(t != goal for t in takes)
                  else "took the right object, not placed" if takes else "never took anything"] += 1
        invalid = sum(1 - v for ep in eps for v in ep.valid) / sum(ep.num_turns for ep in eps)
        print(f"T={temperature}: {len(eps)} episodes {dict(kinds)}; invalid actions {invalid:.3f}")


if __name__ == "__main__":
    main(sys.argv[1:])
