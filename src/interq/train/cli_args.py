"""Command-line options shared by every ``interq`` command that takes config overrides (train, sft, eval, demo,
compare, mismatch): ``--preset`` (where the command has one), ``--help-config [SECTION]`` and ``--force``."""

from __future__ import annotations

import argparse

FORCE_HELP = "allow writing into an --out that holds files this command did not write"
HELP_CONFIG_HELP = ("list every config field (or SECTION's: run, model, env, warm_start, rollout, algo, optim, train; "
                    "or one field, e.g. algo.budget) with its doc, type, default and allowed values, then exit")


def add_config_arguments(p: argparse.ArgumentParser, *, preset: bool = True) -> None:
    """Add ``--preset`` (default :data:`interq.train.config.DEFAULT_PRESET`; left out with ``preset=False``),
    ``--help-config [SECTION]`` (``args.help_config``: None unless given, ``""`` without a section) and ``--force``
    (``args.force``)."""
    from interq.train.config import DEFAULT_PRESET

    if preset:
        p.add_argument("--preset", default=DEFAULT_PRESET, help=f"preset name or YAML path (default: {DEFAULT_PRESET})")
    p.add_argument("--help-config", nargs="?", const="", default=None, metavar="SECTION", help=HELP_CONFIG_HELP)
    p.add_argument("--force", action="store_true", help=FORCE_HELP)


def print_config_help(section: str | None, preset: str | None = None) -> int:
    """Print ``--help-config [SECTION]``'s field reference (with ``preset``'s values where it sets others); raises
    :class:`~interq.train.config.ConfigError` for an unknown section. Returns the exit status, 0."""
    import os
    import sys

    from interq.train.config import config_help

    text = config_help(section or None, preset)
    try:
        print(text, flush=True)
    except BrokenPipeError:  # piped into a reader that stopped early (| head): not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0
