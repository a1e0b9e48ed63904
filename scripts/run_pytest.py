"""Run pytest with every ``-m`` expression on the command line AND-ed into one (pytest itself keeps only the last).

    python scripts/run_pytest.py -m "not verl" -m "$(MARK)" $(PYTEST_ARGS)

The Makefile's test targets pass their own selection first, then the user's ``MARK`` and ``PYTEST_ARGS``, so
``make test PYTEST_ARGS='-m "not slow"'`` runs the tests that are neither slow nor verl, instead of replacing
``not verl``. Empty expressions are dropped; every other argument goes to pytest unchanged.
"""

from __future__ import annotations

import sys


def split_marks(args: list[str]) -> tuple[list[str], list[str]]:
    """(the ``-m`` expressions, the other arguments) of a pytest command line (``-m EXPR`` and ``-mEXPR``)."""
    marks, rest, i = [], [], 0
    while i < len(args):
        a = args[i]
        if a == "-m":
            if i + 1 == len(args):
                raise SystemExit("run_pytest: -m needs a marker expression after it")
            marks.append(args[i + 1])
            i += 2
            continue
        if a.startswith("-m") and not a.startswith("--"):
            marks.append(a[2:])
        else:
            rest.append(a)
        i += 1
    return marks, rest


def combined(marks: list[str]) -> str:
    """``(a) and (b) ...`` of the non-empty expressions ("" for none)."""
    parts = [m.strip() for m in marks if m.strip()]
    return " and ".join(f"({m})" for m in parts) if len(parts) > 1 else "".join(parts)


def main(argv: list[str]) -> int:
    import os

    import pytest

    sys.path[0] = os.getcwd()  # as ``python -m pytest`` has it (this script's folder is not an import root)

    marks, rest = split_marks(argv)
    expr = combined(marks)
    if expr:
        print(f"run_pytest: -m {expr!r}", flush=True)
    return pytest.main((["-m", expr] if expr else []) + rest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
