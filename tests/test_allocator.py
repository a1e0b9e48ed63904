"""INTERQ_ALLOCATOR (interq.allocator): a long command restarts itself once with jemalloc preloaded when asked (or,
by default, when the system has it), children start with their usual allocator, and the allocator changes no
number a run computes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from interq import allocator
from test_cli_train import TOY


def test_choice_is_checked(monkeypatch):
    monkeypatch.setenv(allocator.ENV, "Jemalloc")
    assert allocator.choice() == "jemalloc"
    monkeypatch.setenv(allocator.ENV, "mimalloc")
    with pytest.raises(ValueError, match=r"INTERQ_ALLOCATOR='mimalloc' is not accepted; choose one of \['auto'"):
        allocator.choice()
    with pytest.raises(SystemExit, match="INTERQ_ALLOCATOR='mimalloc'"):
        allocator.reexec_with_allocator(["train"])


def _capture_exec(monkeypatch, lib="/x/libjemalloc.so.2"):
    calls = []
    monkeypatch.setattr(allocator, "find_jemalloc", lambda: lib)
    monkeypatch.setattr(allocator, "in_use", lambda: "system")
    monkeypatch.setattr(allocator.sys, "platform", "linux")
    monkeypatch.setattr(allocator.os, "execve", lambda path, args, env: calls.append((path, args, env)))
    monkeypatch.delenv(allocator._MARK, raising=False)
    monkeypatch.delenv("MALLOC_CONF", raising=False)
    return calls


def test_auto_restarts_the_command_with_jemalloc_preloaded(monkeypatch):
    calls = _capture_exec(monkeypatch)
    monkeypatch.setenv(allocator.ENV, "auto")
    monkeypatch.setenv("LD_PRELOAD", "/y/libother.so")
    allocator.reexec_with_allocator(["train", "--preset", "q-interq", "train.steps=1"])
    (path, args, env), = calls
    assert path == sys.executable and args == [sys.executable, "-m", "interq", "train", "--preset", "q-interq",
                                                "train.steps=1"]
    assert env["LD_PRELOAD"] == "/x/libjemalloc.so.2:/y/libother.so"  # first, the user's preloads kept
    assert env["MALLOC_CONF"] == allocator.JEMALLOC_CONF
    # in the restarted process: no second restart, and the environment children inherit is the user's again
    monkeypatch.setattr(allocator.os, "environ", dict(env))
    monkeypatch.setattr(allocator, "in_use", lambda: "jemalloc")
    allocator.reexec_with_allocator(["train"])
    assert len(calls) == 1
    assert allocator.os.environ["LD_PRELOAD"] == "/y/libother.so" and "MALLOC_CONF" not in allocator.os.environ
    assert allocator._MARK not in allocator.os.environ


def test_system_or_missing_library_runs_as_started_and_jemalloc_required_says_how(monkeypatch, capsys):
    calls = _capture_exec(monkeypatch)
    monkeypatch.setenv(allocator.ENV, "system")
    allocator.reexec_with_allocator(["train"])
    assert capsys.readouterr().err == ""
    calls = _capture_exec(monkeypatch, lib=None)
    monkeypatch.setenv(allocator.ENV, "auto")
    allocator.reexec_with_allocator(["train"])
    assert calls == []
    assert "[allocator] system: no jemalloc found (Debian/Ubuntu: apt-get install libjemalloc2" in capsys.readouterr().err
    monkeypatch.setenv(allocator.ENV, "jemalloc")
    with pytest.raises(SystemExit, match="apt-get install libjemalloc2"):
        allocator.reexec_with_allocator(["train"])


def test_a_call_from_python_never_restarts(monkeypatch, capsys):
    from interq.cli import main

    calls = _capture_exec(monkeypatch)
    monkeypatch.setenv(allocator.ENV, "jemalloc")
    assert main(["train", "--help-config"]) == 0
    assert calls == []


def _run(tmp_path: Path, name: str, choice: str) -> tuple[list[dict], str]:
    out = tmp_path / name
    env = {**os.environ, allocator.ENV: choice, "OMP_NUM_THREADS": "1"}
    env.pop("LD_PRELOAD", None)
    res = subprocess.run([sys.executable, "-m", "interq", "train", "--preset", "q-interq", "--out", str(out), *TOY],
                         env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    recs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "sync/"))} for r in recs], res.stderr


@pytest.mark.skipif(allocator.find_jemalloc() is None, reason="no jemalloc on this system (apt-get install libjemalloc2)")
def test_a_run_under_jemalloc_computes_what_it_computes_under_the_system_allocator(tmp_path):
    with_jemalloc, err = _run(tmp_path, "jemalloc", "jemalloc")
    assert "[allocator] jemalloc (INTERQ_ALLOCATOR=jemalloc)" in err
    with_system, err = _run(tmp_path, "system", "system")
    assert "[allocator]" not in err
    assert with_jemalloc == with_system  # every logged number of every step, bit for bit


def test_python_workers_get_the_preload_back_and_take_it_off_their_own_environment(monkeypatch):
    env = {"LD_PRELOAD": "/y/libother.so", "PATH": "/bin"}
    monkeypatch.setattr(allocator.os, "environ", dict(env))
    monkeypatch.setattr(allocator, "_TAKEN_OFF", [])
    with allocator.for_python_workers():  # a process without the restart: nothing to give back
        assert allocator.os.environ == env
    # the restarted process took "/x/libjemalloc.so.2" (and the settings it added) off its environment
    monkeypatch.setattr(allocator, "_TAKEN_OFF", ["/x/libjemalloc.so.2|1"])
    with allocator.for_python_workers():
        spawned = dict(allocator.os.environ)  # what a worker spawned here inherits
    assert spawned["LD_PRELOAD"] == "/x/libjemalloc.so.2:/y/libother.so"
    assert spawned["MALLOC_CONF"] == allocator.JEMALLOC_CONF and allocator._MARK in spawned
    assert allocator.os.environ == env  # the parent's environment as it was
    monkeypatch.setattr(allocator.os, "environ", spawned)  # in the worker: its initializer
    monkeypatch.setattr(allocator, "in_use", lambda: "jemalloc")
    allocator.settle_environment()
    assert allocator.os.environ == env
