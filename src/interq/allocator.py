"""The memory allocator a long ``interq`` command runs with (``INTERQ_ALLOCATOR``).

A learner pass allocates and frees gigabytes of activations per micro-batch. glibc returns large freed blocks to
the kernel and takes fresh, zeroed pages for the next ones: on the 2-core development machine (a VM) a SmolLM2 RL
step took 6-8 million page faults and 52-120 s of system time, varying with the host's state. jemalloc with page
purging turned off (``MALLOC_CONF=dirty_decay_ms:-1,muzzy_decay_ms:-1``: freed pages stay with the process and are
reused) took the same learner micro-batch (aligned SmolLM2, 2 x 2,020 tokens, 1 thread, its third pass) from 63.5 to
52.1 CPU s (2026-12-02, an AMD EPYC with AVX-512; docs/performance.md). The allocator does not change any number a run computes (torch
aligns every CPU tensor to 64 bytes whichever allocator serves it; tested: the same run under both).

``INTERQ_ALLOCATOR``:

* ``auto`` (default): jemalloc when the system has it (``libjemalloc.so.2``; Debian/Ubuntu: ``apt-get install
  libjemalloc2``), else the system allocator;
* ``jemalloc``: jemalloc, or stop with a message saying how to install it;
* ``system``: the C library's allocator, as started.

An allocator must be in place before the process starts, so :func:`reexec_with_allocator` replaces the starting
``interq`` process (same pid, same arguments) by one with jemalloc preloaded; the ``interq`` command line calls it
first. The preload is taken off the new process's environment again, so the environment workers and simulators it
starts (ALFWorld, the ScienceWorld JVM) run with their usual allocator; the training workers of ``compare --jobs
N`` get it back (:func:`for_python_workers`).
"""

from __future__ import annotations

import contextlib
import ctypes.util
import os
import sys
from pathlib import Path

ENV = "INTERQ_ALLOCATOR"
CHOICES = ("auto", "jemalloc", "system")
JEMALLOC_CONF = "dirty_decay_ms:-1,muzzy_decay_ms:-1"  # never hand freed pages back: reuse them (no refaults)
_MARK = "_INTERQ_ALLOCATOR_REEXEC"  # set across the exec: the preload to take off, and no second exec
_CANDIDATES = ("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2", "/usr/lib/aarch64-linux-gnu/libjemalloc.so.2",
               "/usr/lib64/libjemalloc.so.2", "/usr/lib/libjemalloc.so.2", "/usr/local/lib/libjemalloc.so.2")


def choice() -> str:
    """``INTERQ_ALLOCATOR``, checked: one of :data:`CHOICES`."""
    value = os.environ.get(ENV, "auto").strip().lower() or "auto"
    if value not in CHOICES:
        raise ValueError(f"{ENV}={value!r} is not accepted; choose one of {list(CHOICES)}")
    return value


def find_jemalloc() -> str | None:
    """The path (or, found by the dynamic linker's search, the name) of jemalloc's shared library, or None."""
    for path in _CANDIDATES:
        if Path(path).is_file():
            return path
    return ctypes.util.find_library("jemalloc")


def in_use() -> str:
    """The allocator this process runs with: ``jemalloc`` or ``tcmalloc`` when one is mapped, else ``system``."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return "system"
    for name in ("jemalloc", "tcmalloc"):
        if f"lib{name}" in maps:
            return name
    return "system"


def _add_preload(env, lib: str, add_conf: bool) -> None:
    """Put ``lib`` first on ``LD_PRELOAD`` in ``env`` (the user's preloads kept after it), and the jemalloc settings
    when ``add_conf``."""
    env["LD_PRELOAD"] = ":".join([lib, *[p for p in env.get("LD_PRELOAD", "").split(":") if p]])
    if add_conf:
        env["MALLOC_CONF"] = JEMALLOC_CONF


def _strip_preload(env, lib: str) -> None:
    """Take ``lib`` (which :func:`reexec_with_allocator` put first) off ``LD_PRELOAD`` in ``env``."""
    rest = [p for p in env.get("LD_PRELOAD", "").split(":") if p and p != lib]
    if rest:
        env["LD_PRELOAD"] = ":".join(rest)
    else:
        env.pop("LD_PRELOAD", None)


_TAKEN_OFF: list[str] = []  # the marker settle_environment() took off this process's environment


def settle_environment() -> None:
    """In the process :func:`reexec_with_allocator` started (or a worker :func:`for_python_workers` spawned): take
    the preload (and the jemalloc settings it added) off ``os.environ``, so that the processes it starts (environment
    workers, simulators) start as they would have."""
    mark = os.environ.pop(_MARK, None)
    if not mark:
        return
    _TAKEN_OFF[:] = [mark]
    lib, _, added_conf = mark.partition("|")
    _strip_preload(os.environ, lib)
    if added_conf == "1":
        os.environ.pop("MALLOC_CONF", None)
    print(f"[allocator] {in_use()} ({ENV}={choice()})", file=sys.stderr)


def reexec_with_allocator(argv: list[str]) -> None:
    """Replace this process by ``python -m interq <argv>`` with jemalloc preloaded, when ``INTERQ_ALLOCATOR`` asks
    for it (``auto``: when found) and it is not loaded yet. Returns when nothing is to be done; raises
    ``SystemExit`` with a message for ``INTERQ_ALLOCATOR=jemalloc`` without jemalloc or an invalid value."""
    if _MARK in os.environ:  # the exec'd process: do not exec again, whatever happened
        settle_environment()
        return
    from interq import switches

    try:
        # every INTERQ_* switch, before anything (interq.switches); this one's own message is choice()'s, below
        switches.check_environment({k: v for k, v in os.environ.items() if k != ENV})
    except switches.SwitchError as e:
        print(f"interq: invalid configuration: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    try:
        wanted = choice()
    except ValueError as e:
        raise SystemExit(f"interq: {e}") from None
    if wanted == "system" or in_use() == "jemalloc" or not sys.platform.startswith("linux"):
        return
    lib = find_jemalloc()
    if lib is None:
        if wanted == "jemalloc":
            raise SystemExit(f"interq: {ENV}=jemalloc but no jemalloc library was found; install it (Debian/Ubuntu: "
                             f"apt-get install libjemalloc2) or set {ENV}=auto or system")
        print(f"[allocator] system: no jemalloc found (Debian/Ubuntu: apt-get install libjemalloc2; a SmolLM2 RL "
              f"step's learner then takes less CPU, the same numbers; {ENV}=system hides this line)", file=sys.stderr)
        return
    env = dict(os.environ)
    added_conf = "MALLOC_CONF" not in env
    _add_preload(env, lib, added_conf)
    env[_MARK] = f"{lib}|{int(added_conf)}"
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(sys.executable, [sys.executable, "-m", "interq", *argv], env)
    except OSError as e:  # could not exec: carry on with the allocator we have
        print(f"interq: could not restart with jemalloc ({e}); continuing with the system allocator", file=sys.stderr)


@contextlib.contextmanager
def for_python_workers():
    """While interq spawns its own Python workers (``compare --jobs N``): the preload this process started with is
    in the environment again, so they run with the same allocator; each takes it off its own environment with
    :func:`settle_environment` (pass it as the pool's initializer)."""
    if not _TAKEN_OFF:
        yield
        return
    saved = dict(os.environ)
    lib, _, added_conf = _TAKEN_OFF[0].partition("|")
    _add_preload(os.environ, lib, added_conf == "1")
    os.environ[_MARK] = _TAKEN_OFF[0]
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)
