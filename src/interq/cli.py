"""The ``interq`` command line: ``interq <command> [options] [key.sub=value ...]``.

Each command is one small function below (``_cmd_<name>``, taking the arguments after the command's name);
:data:`COMMANDS` lists them with their one-sentence description, which ``interq --help`` shows one per line.
:func:`main` dispatches, and turns the errors a user can fix (:class:`~interq.train.config.ConfigError`, a stale
result, training stopped by non-finite values) into one line on stderr.
"""

from __future__ import annotations

import argparse
import sys
import textwrap

from interq.train.cli_args import add_config_arguments, print_config_help

_FRESH_HELP = ("move a warm start or run in --out that was made from other inputs aside to <dir>.stale-<time> and "
               "start it again (default: stop and name every differing field)")


def _config_parser(prog: str, description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"interq {prog}", description=description)
    add_config_arguments(p)
    p.add_argument("--out", default=None, help="run directory (default: runs/<name>)")
    p.add_argument("overrides", nargs="*", help="key.sub=value overrides, e.g. train.steps=10")
    return p


def _load(args) -> "object":
    """The validated config of ``--preset`` and the overrides, its environment checked; exit 2 with one line if not."""
    from interq.train.build import check_env
    from interq.train.config import ConfigError, build_config

    try:
        cfg = build_config(args.preset, args.overrides)
        check_env(cfg.env)  # env.name, env.env_kwargs, the splits, env.task_types: against the env itself
        return cfg
    except ConfigError as e:
        print(f"interq: invalid configuration: {e}", file=sys.stderr)
        raise SystemExit(2) from None


# ---------------------------------------------------------------------------------------------- commands


def _cmd_selfcheck(argv: list[str]) -> int:
    from interq.selfcheck import main as selfcheck_main

    return selfcheck_main(argv)


def _cmd_train(argv: list[str]) -> int:
    p = _config_parser("train", "warm start (unless --policy) then RL; resumes from the run directory's last checkpoint")
    p.add_argument("--policy", default=None, help="start from this policy directory (skips the warm start)")
    p.add_argument("--no-resume", action="store_true", help="start the run directory again from step 0: its existing "
                   "checkpoints are moved aside to checkpoints.stale-<time> (its stored config must match; else see --fresh)")
    p.add_argument("--fresh", action="store_true", help=_FRESH_HELP)
    args = p.parse_args(argv)
    if args.help_config is not None:
        return print_config_help(args.help_config, args.preset)
    cfg = _load(args)
    from interq.train.pipeline import run_training

    out = args.out or f"runs/{cfg.name}"
    recs = run_training(cfg, out, args.policy, resume=not args.no_resume, fresh=args.fresh, force=args.force)
    evals = [r for r in recs if "eval/success" in r]
    if evals:
        print(f"held-out success: step {evals[0]['step']} {evals[0]['eval/success']:.3f} -> "
              f"step {evals[-1]['step']} {evals[-1]['eval/success']:.3f}; metrics in {out}/metrics.jsonl")
    return 0


def _cmd_sft(argv: list[str]) -> int:
    p = _config_parser("sft", "build the policy and warm-start it on expert demonstrations; writes a policy directory")
    p.add_argument("--fresh", action="store_true", help=_FRESH_HELP)
    args = p.parse_args(argv)
    if args.help_config is not None:
        return print_config_help(args.help_config, args.preset)
    cfg = _load(args)
    import json

    from interq.train.pipeline import prepare_policy

    out = args.out or f"runs/{cfg.name}/warm_start"
    path, summary = prepare_policy(cfg, out, fresh=args.fresh)
    print(json.dumps({"policy_dir": str(path), **summary}, default=str))
    return 0


def _cmd_eval(argv: list[str]) -> int:
    from interq.train.config import EXECUTORS

    p = argparse.ArgumentParser(prog="interq eval", description="play a saved policy on the held-out tasks of an "
                                "environment (the preset's, or env.name=... among the overrides) with the trainer's own "
                                "evaluation; prints a table, writes eval.json in --out, ends with RESULT {json}")
    add_config_arguments(p)
    p.add_argument("--policy", default=None, help="policy directory (a warm start, a checkpoint, or a "
                   "run directory: its newest checkpoint), or smollm2")
    p.add_argument("--episodes", type=int, default=None, help="held-out episodes: the first N held-out tasks, one "
                   "episode each (default: env.num_eval_tasks x train.eval_episodes_per_task)")
    p.add_argument("--executor", default="arm", choices=["arm", *EXECUTORS], help="the executor that plays: the "
                   "preset's (arm, default: rollout.executor) or bf16, fp32, w8a8")
    p.add_argument("--out", default=None, help="output directory (default: runs/eval/<name>)")
    p.add_argument("overrides", nargs="*", help="key.sub=value overrides, e.g. env.name=alfworld train.eval_temperature=0")
    args = p.parse_args(argv)
    if args.help_config is not None:
        return print_config_help(args.help_config, args.preset)
    if args.policy is None:
        p.error("--policy DIR is required")
    from interq.train.evaluate import eval_command

    return eval_command(args, "interq eval " + " ".join(argv))


def _cmd_demo(argv: list[str]) -> int:
    from interq.train.experiments import demo_main

    return demo_main(argv)


def _cmd_compare(argv: list[str]) -> int:
    from interq.train.experiments import compare_main

    return compare_main(argv)


def _cmd_mismatch(argv: list[str]) -> int:
    from interq.train.mismatch import main as mismatch_main

    return mismatch_main(argv)


# name -> (function, the one sentence ``interq --help`` shows), in the order it lists them
COMMANDS = {
    "train": (_cmd_train, "Warm-start a policy, then train it with RL."),
    "sft": (_cmd_sft, "Warm-start a policy on expert demonstrations only."),
    "eval": (_cmd_eval, "Evaluate a saved policy on held-out tasks."),
    "demo": (_cmd_demo, "Train bf16 and q-interq side by side, briefly."),
    "compare": (_cmd_compare, "Train several arms over seeds and compare them."),
    "mismatch": (_cmd_mismatch, "Measure the executor/learner mismatch per turn."),
    "selfcheck": (_cmd_selfcheck, "Check the correction math on a synthetic batch."),
}


def _epilog() -> str:
    from interq.train.config import preset_names

    from interq.train.config import DEFAULT_PRESET as default

    text = (f"Commands that take a preset start from {default} unless --preset names another; presets: "
            f"{', '.join(preset_names())}, or a YAML file. An arm preset with env.name=<env> among the overrides "
            "builds on that environment's preset. Overrides are key.sub=value, e.g. "
            f"interq train --preset {default} train.steps=50 algo.budget=0.25; invalid values are refused before any "
            "work. `interq <command> --help` lists a command's options, `interq <command> --help-config [SECTION]` "
            "every config field with its doc.")
    return textwrap.fill(text, width=100)


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """argparse's, with the sub-commands' help column wide enough for the longest name (argparse measures the
    sub-commands one indent shallower than it prints them)."""

    def add_argument(self, action: argparse.Action) -> None:
        super().add_argument(action)
        if action.nargs == argparse.PARSER:
            self._action_max_length += 2


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser: ``--help`` (the commands, one per line), ``--version``. Each command parses its own
    arguments (``interq <command> --help``)."""
    from interq import __version__

    parser = argparse.ArgumentParser(prog="interq", description="RL for multi-turn LLM agents with quantized rollouts "
                                     "and the InterQ history correction.", epilog=_epilog(),
                                     formatter_class=_HelpFormatter)
    parser.add_argument("--version", action="version", version=f"interq {__version__}")
    sub = parser.add_subparsers(title="commands", metavar="<command>", dest="command")
    for name, (_, sentence) in COMMANDS.items():
        sub.add_parser(name, help=sentence, add_help=False)
    return parser


def _asks_help(args: list[str]) -> bool:
    return any(a in ("-h", "--help") or a.startswith("--help-config") for a in args)


def main(argv: list[str] | None = None) -> int:
    """Run one command. Started as a process (``argv`` None: the ``interq`` script, ``python -m interq``) a long
    command first takes the allocator ``INTERQ_ALLOCATOR`` asks for (:mod:`interq.allocator`: jemalloc where the
    system has it), which restarts the process once; a call with ``argv`` (from Python) runs as it is."""
    started = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    if started and argv and argv[0] in COMMANDS and argv[0] != "selfcheck" and not _asks_help(argv[1:]):
        from interq.allocator import reexec_with_allocator

        reexec_with_allocator(argv)
    if not argv or argv[0] not in COMMANDS:
        parser = build_parser()
        if not argv or argv[0] in ("-h", "--help"):
            parser.print_help()
            return 0 if argv else 2
        if argv[0] == "--version":
            from interq import __version__

            print(f"interq {__version__}")
            return 0
        parser.parse_args(argv[:1])  # an unknown command or option: one usage line naming the commands, exit 2
        return 2
    return _run(argv[0], argv[1:])


def _run(command: str, args: list[str]) -> int:
    """``COMMANDS[command]`` on ``args``, the errors a user can fix as one line on stderr."""
    from interq import rundir
    from interq.train.config import ConfigError, NonFiniteTrainingError
    from interq.train.provenance import StaleResultError

    try:
        with rundir.running([command, *args]):  # the resume command; Ctrl-C / SIGTERM: one line (interq.rundir)
            return COMMANDS[command][0](args)
    except rundir.RunDirError as e:  # locked, unusable or foreign --out; a record resume would lose; a full disk
        print(f"interq: {e}", file=sys.stderr)
        return 2
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
