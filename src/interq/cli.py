"""The ``interq`` command line.  ``interq --help`` lists the sub-commands; ``interq <command> --help`` its options.

Configuration: ``--preset NAME`` (one of the YAML presets in ``src/interq/presets``: the five arms ``bf16``,
``q-naive``, ``q-tis``, ``q-align``, ``q-interq``, or an environment's: ``household``, ``alfworld``, ``scienceworld``,
``synthshop``; an arm with ``env.name=<env>`` builds on that environment's preset) then any number of
``key.sub=value`` overrides, e.g. ``interq train --preset q-interq train.steps=50 algo.budget=0.25``.
``interq train --help-config`` lists every field with its default. Invalid values are rejected before any work
starts.
"""

from __future__ import annotations

import argparse
import sys


def _cmd_selfcheck(argv: list[str]) -> int:
    from interq.selfcheck import main as selfcheck_main

    return selfcheck_main(argv)


_FRESH_HELP = ("move a warm start or run in --out that was made from other inputs aside to <dir>.stale-<time> and "
               "start it again (default: stop and name every differing field)")


def _config_parser(prog: str, help_: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"interq {prog}", description=help_)
    p.add_argument("--preset", default="bf16", help="preset name or YAML path (default: bf16)")
    p.add_argument("--out", default=None, help="run directory (default: runs/<name>)")
    p.add_argument("--help-config", action="store_true", help="list every config field and its default, then exit")
    p.add_argument("overrides", nargs="*", help="key.sub=value overrides, e.g. train.steps=10")
    return p


def _help_config() -> int:
    from interq.train.config import describe

    for name, tp, default in describe():
        print(f"{name:40s} {tp:6s} {default!r}")
    return 0


def _load(args) -> "object":
    from interq.train.build import check_env
    from interq.train.config import ConfigError, build_config

    try:
        cfg = build_config(args.preset, args.overrides)
        check_env(cfg.env)  # env.name, env.env_kwargs, the splits, env.task_types: against the env itself
        return cfg
    except ConfigError as e:
        print(f"interq: invalid configuration: {e}", file=sys.stderr)
        raise SystemExit(2) from None


def _cmd_train(argv: list[str]) -> int:
    p = _config_parser("train", "warm start (unless --policy) then RL; resumes from the run directory's last checkpoint")
    p.add_argument("--policy", default=None, help="start from this policy directory (skips the warm start)")
    p.add_argument("--no-resume", action="store_true", help="start the run directory again from step 0: its existing "
                   "checkpoints are moved aside to checkpoints.stale-<time> (its stored config must match; else see --fresh)")
    p.add_argument("--fresh", action="store_true", help=_FRESH_HELP)
    args = p.parse_args(argv)
    if args.help_config:
        return _help_config()
    cfg = _load(args)
    from interq.train.pipeline import run_training

    out = args.out or f"runs/{cfg.name}"
    recs = run_training(cfg, out, args.policy, resume=not args.no_resume, fresh=args.fresh)
    evals = [r for r in recs if "eval/success" in r]
    if evals:
        print(f"held-out success: step {evals[0]['step']} {evals[0]['eval/success']:.3f} -> "
              f"step {evals[-1]['step']} {evals[-1]['eval/success']:.3f}; metrics in {out}/metrics.jsonl")
    return 0


def _cmd_sft(argv: list[str]) -> int:
    p = _config_parser("sft", "build the policy and warm-start it on expert demonstrations; writes a policy directory")
    p.add_argument("--fresh", action="store_true", help=_FRESH_HELP)
    args = p.parse_args(argv)
    if args.help_config:
        return _help_config()
    cfg = _load(args)
    import json

    from interq.train.pipeline import prepare_policy

    out = args.out or f"runs/{cfg.name}/warm_start"
    path, summary = prepare_policy(cfg, out, fresh=args.fresh)
    print(json.dumps({"policy_dir": str(path), **summary}, default=str))
    return 0


def _cmd_demo(argv: list[str]) -> int:
    from interq.train.experiments import demo_main

    return demo_main(argv)


def _cmd_compare(argv: list[str]) -> int:
    from interq.train.experiments import compare_main

    return compare_main(argv)


def _cmd_mismatch(argv: list[str]) -> int:
    from interq.train.mismatch import main as mismatch_main

    return mismatch_main(argv)


COMMANDS = {
    "selfcheck": (_cmd_selfcheck, "exercise the correction math on a synthetic batch and print its metrics"),
    "train": (_cmd_train, "warm start + RL for one arm/preset (checkpoints, resume, metrics.jsonl)"),
    "sft": (_cmd_sft, "warm start only: tiny policy + SFT on expert demos -> a policy directory"),
    "demo": (_cmd_demo, "warm start + short RL runs of bf16 and q-interq on household; table, plot, RESULT line"),
    "compare": (_cmd_compare, "the five arms over several seeds; markdown table, learning curves, mismatch plot"),
    "mismatch": (_cmd_mismatch, "play episodes with the executor, recompute the learner's log-probs; per-turn mismatch table, plot, RESULT line"),
}


def main(argv: list[str] | None = None) -> int:
    """Run one command. Started as a process (``argv`` None: the ``interq`` script, ``python -m interq``) a long
    command first takes the allocator ``INTERQ_ALLOCATOR`` asks for (:mod:`interq.allocator`: jemalloc where the
    system has it), which restarts the process once; a call with ``argv`` (from Python) runs as it is."""
    started = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    if started and argv and argv[0] in COMMANDS and argv[0] != "selfcheck":
        from interq.allocator import reexec_with_allocator

        reexec_with_allocator(argv)
    parser = argparse.ArgumentParser(prog="interq", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=sorted(COMMANDS), help="; ".join(f"{k}: {v[1]}" for k, v in sorted(COMMANDS.items())))
    if not argv or argv[0] in ("-h", "--help"):
        parser.print_help()
        return 0 if argv else 2
    if argv[0] not in COMMANDS:
        parser.error(f"unknown command {argv[0]!r}; accepted: {', '.join(sorted(COMMANDS))}")
    from interq.train.provenance import StaleResultError
    from interq.train.config import ConfigError, NonFiniteTrainingError

    try:
        return COMMANDS[argv[0]][0](argv[1:])
    except StaleResultError as e:  # an existing result of other inputs: nothing was run (see --fresh)
        print(f"interq: {e}", file=sys.stderr)
        return 2
    except ConfigError as e:  # a value only found wrong once used (e.g. a policy directory): one line, no traceback
        print(f"interq: invalid configuration: {e}", file=sys.stderr)
        return 2
    except NonFiniteTrainingError as e:  # stopped cleanly: metrics and checkpoints up to the last good step are kept
        print(f"interq: training stopped: {e}", file=sys.stderr)
        return 3


if __name__ == "__main__":
    raise SystemExit(main())
