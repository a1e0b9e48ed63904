"""The ``interq`` command line.  ``interq --help`` lists the sub-commands."""

from __future__ import annotations

import argparse
import sys


def _cmd_selfcheck(argv: list[str]) -> int:
    from interq.selfcheck import main as selfcheck_main

    return selfcheck_main(argv)


COMMANDS = {
    "selfcheck": (_cmd_selfcheck, "exercise the correction math on a synthetic batch and print its metrics"),
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="interq", description=__doc__)
    parser.add_argument("command", choices=sorted(COMMANDS), help="; ".join(f"{k}: {v[1]}" for k, v in sorted(COMMANDS.items())))
    if not argv or argv[0] in ("-h", "--help"):
        parser.print_help()
        return 0 if argv else 2
    if argv[0] not in COMMANDS:
        parser.error(f"unknown command {argv[0]!r}; accepted: {', '.join(sorted(COMMANDS))}")
    return COMMANDS[argv[0]][0](argv[1:])
