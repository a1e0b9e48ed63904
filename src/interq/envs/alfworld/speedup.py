"""Optional speed-up of TextWorld's PDDL engine: same output, less parsing.

A PDDL step in TextWorld derives one text per admissible action through its grammar, and every
derivation re-parses constant strings with TatSu (``textworld.envs.pddl.textgen._parse_and_convert``
for grammar symbols, ``textworld.logic._parse_and_convert`` for the conditions of grammar rules).
Those parses are pure functions of ``(string, rule_name)``, so :func:`install` memoises them and
hands every caller a deep copy, which is what a fresh parse returns. Observations and admissible
actions are unchanged (a test plays whole episodes with and without it and compares every step);
it roughly halves a step. :func:`uninstall` restores the originals.
"""

from __future__ import annotations

import copy
import functools
import threading

_lock = threading.Lock()
_originals: dict[str, object] = {}


def _memoised(orig):
    @functools.lru_cache(maxsize=16384)
    def _cached(text: str, rule_name: str):
        return orig(text, rule_name=rule_name)

    def parse_and_convert(*args, **kwargs):
        if (len(args) == 1 and isinstance(args[0], str) and set(kwargs) <= {"rule_name", "trace"}
                and not kwargs.get("trace") and isinstance(kwargs.get("rule_name"), str)):
            return copy.deepcopy(_cached(args[0], kwargs["rule_name"]))
        return orig(*args, **kwargs)

    return parse_and_convert


def _modules():
    import textworld.logic as logic
    from textworld.envs.pddl import textgen
    return {"textgen": textgen, "logic": logic}


def install() -> bool:
    """Memoise TextWorld's parsing; True if this call installed it (False: already installed)."""
    with _lock:
        if _originals:
            return False
        for key, mod in _modules().items():
            _originals[key] = mod._parse_and_convert
            mod._parse_and_convert = _memoised(mod._parse_and_convert)
        return True


def uninstall() -> None:
    with _lock:
        for key, mod in _modules().items():
            if key in _originals:
                mod._parse_and_convert = _originals.pop(key)


def installed() -> bool:
    return bool(_originals)
