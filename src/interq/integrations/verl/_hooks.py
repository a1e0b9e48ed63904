"""Run a function right after a module is imported (or now, if it already is).

verl imports every ``verl.plugins`` entry point on ``import verl``, in every process (driver, Ray
workers, rollout servers). Importing verl's trainer modules there to patch them would cost seconds in
every process and import them half-way through ``verl/__init__``. Instead the plugin registers
post-import hooks: the patch runs when (and only if) a process imports the module.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import threading
from types import ModuleType
from typing import Callable

Hook = Callable[[ModuleType], None]


class _PostImportFinder(importlib.abc.MetaPathFinder):
    def __init__(self) -> None:
        self.hooks: dict[str, list[Hook]] = {}
        self._busy = threading.local()

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self.hooks or getattr(self._busy, fullname, False):
            return None
        setattr(self._busy, fullname, True)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            setattr(self._busy, fullname, False)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader_exec = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            loader_exec(module)
            for hook in self.hooks.get(fullname, ()):
                hook(module)

        spec.loader.exec_module = exec_module  # this spec's own loader instance
        return spec


_FINDER = _PostImportFinder()


def when_imported(name: str, hook: Hook) -> None:
    """Call ``hook(module)`` once ``name`` is imported; immediately if it already is."""
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
    _FINDER.hooks.setdefault(name, [])
    if hook not in _FINDER.hooks[name]:
        _FINDER.hooks[name].append(hook)
    module = sys.modules.get(name)
    if module is not None:
        hook(module)
