"""Environments: one protocol (:mod:`interq.envs.base`), a registry, a worker pool, demonstrations.

``make_env(name, **kwargs)`` builds an environment by name. Entries are imported lazily, so the
optional engines (alfworld, scienceworld, a WebShop install) are only needed when asked for:

=================  =================================  ======================================
name               module                             needs
=================  =================================  ======================================
``household``      ``interq.envs.household``          nothing (built in, pure Python)
``synthshop``      ``interq.envs.synthshop``          nothing (built in; NOT WebShop's data)
``alfworld``       ``interq.envs.alfworld``           extra ``interq[alfworld]``
``scienceworld``   ``interq.envs.scienceworld``       extra ``interq[scienceworld]`` + Java
``webshop``        ``interq.envs.webshop``            a WebShop install
=================  =================================  ======================================

How a lazy module is turned into an env: ``module.make_env(**kwargs)`` if the module defines it,
otherwise the first class in the module whose ``name`` attribute equals the registry name.
``register_env(name, target)`` adds an entry (``target``: a callable, or ``"module"`` /
``"module:attr"``).
"""

from __future__ import annotations

import importlib
from typing import Any, Callable

from .base import Env, EpisodeError, Observation, ParsedAction, StepResult, TaskSpec, UnknownTaskError

_REGISTRY: dict[str, str | Callable[..., Env]] = {
    "household": "interq.envs.household:HouseholdEnv",
    "synthshop": "interq.envs.synthshop:SynthShopEnv",
    "alfworld": "interq.envs.alfworld",
    "scienceworld": "interq.envs.scienceworld",
    "webshop": "interq.envs.webshop",
}


class UnknownEnvError(ValueError):
    pass


def list_envs() -> list[str]:
    return sorted(_REGISTRY)


def register_env(name: str, target: str | Callable[..., Env], overwrite: bool = False) -> None:
    """Add ``name`` to the registry (``target``: callable returning an Env, or "module[:attr]")."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"env name must be a non-empty str; got {name!r}")
    if name in _REGISTRY and not overwrite:
        raise ValueError(f"env {name!r} is already registered (pass overwrite=True to replace it)")
    _REGISTRY[name] = target


def _resolve(name: str, target: str) -> Callable[..., Env]:
    mod_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(mod_name)
    except ModuleNotFoundError as e:
        if e.name and (e.name == mod_name or mod_name.startswith(e.name + ".")):
            raise UnknownEnvError(f"env {name!r}: its adapter module {mod_name!r} is not available in this "
                                  f"installation ({e})") from e
        raise  # the adapter exists but a dependency is missing: keep its own message (MissingDependency)
    if attr:
        return getattr(module, attr)
    factory = getattr(module, "make_env", None)
    if callable(factory):
        return factory
    for value in vars(module).values():
        if isinstance(value, type) and getattr(value, "name", None) == name and hasattr(value, "step"):
            return value
    raise UnknownEnvError(f"env {name!r}: module {mod_name!r} defines neither make_env(**kwargs) nor an env class "
                          f"with name = {name!r}")


def make_env(name: str, **kwargs: Any) -> Env:
    """Build the environment registered as ``name`` with ``kwargs`` (see the table above)."""
    if name not in _REGISTRY:
        raise UnknownEnvError(f"unknown env {name!r}; accepted: {list_envs()}")
    target = _REGISTRY[name]
    factory = _resolve(name, target) if isinstance(target, str) else target
    return factory(**kwargs)


__all__ = ["Env", "EpisodeError", "Observation", "ParsedAction", "StepResult", "TaskSpec", "UnknownTaskError",
           "UnknownEnvError", "list_envs", "make_env", "register_env"]
