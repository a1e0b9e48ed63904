"""The env registry: built-in entries, lazy optional ones, clear errors."""

from __future__ import annotations

import pytest

from interq.envs import UnknownEnvError, list_envs, make_env, register_env
from interq.envs.base import Env


def test_builtin_entries():
    assert {"household", "synthshop", "alfworld", "scienceworld", "webshop"} <= set(list_envs())
    env = make_env("household", split_sizes={"train": 2}, max_steps=7)
    assert isinstance(env, Env) and env.name == "household" and env.max_steps == 7


def test_unknown_env_names_accepted():
    with pytest.raises(UnknownEnvError, match="household"):
        make_env("nethack")


def test_lazy_missing_module_is_clear():
    register_env("ghost", "interq.envs._does_not_exist")
    with pytest.raises(UnknownEnvError, match="not available"):
        make_env("ghost")
    with pytest.raises(ValueError, match="already registered"):
        register_env("ghost", "x")
    register_env("ghost", lambda **kw: make_env("household", **kw), overwrite=True)
    assert make_env("ghost", split_sizes={"train": 1}).name == "household"


def test_bad_kwargs_are_named():
    with pytest.raises(ValueError, match="max_steps"):
        make_env("household", max_steps=0)
    with pytest.raises(ValueError, match="split_sizes"):
        make_env("household", split_sizes={"test": 3})
