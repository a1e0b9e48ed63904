"""One writer per run directory, ``--out`` checked before any work, and a clean stop on Ctrl-C / SIGTERM.

**The lock.** Every command that writes a run (``train``, ``sft``, ``demo``, ``compare``, ``mismatch``, ``eval``)
first takes the lock of its output directory ``D``: the file ``<parent of D>/.<name of D>.interq.lock`` beside it
(not inside: a warm start replaces its whole directory when it is saved, and ``--fresh`` moves a directory aside),
holding the owner's process id, host, command and start time, and held with ``flock`` for as long as the command
runs. The kernel releases a ``flock`` when its process ends, however it ends, so a lock left by a killed command is
known to be stale and is taken over with a one-line message. A second writer is refused in one line that names the
holder. A directory inside a locked one (a run of ``compare``) counts as locked by the same holder, except for the
holder's own worker processes (``compare --jobs N``), which lock their run directories themselves; taking a
directory also checks the locks of the directories one and two levels below it.

**--out.** Before any work: ``--out`` that is a file, that cannot be created or written, or that holds files the
command did not write is refused in one line naming the path (foreign files pass with ``--force``; even then no
file of the user's is ever overwritten: a name the command would write that already holds a file the command did
not write is refused).

**Signals.** While a command holds its lock, SIGTERM is turned into an interruption like Ctrl-C; either ends the
command with one line saying where the run stopped (its last checkpoint and record) and the command that resumes it,
exit status 130 (Ctrl-C) or 143 (SIGTERM), no traceback.
"""

from __future__ import annotations

import contextlib
import fnmatch
import functools
import json
import os
import shlex
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from interq.train.config import ConfigError

LOCK_SUFFIX = ".interq.lock"


class RunDirError(ConfigError):
    """A run directory cannot be used (locked by another writer, not writable, holding foreign files); nothing was
    run. The message is one line naming the path."""


class Interrupted(KeyboardInterrupt):
    """SIGTERM, delivered as an interruption so that ``finally`` blocks run as they do for Ctrl-C."""


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------- the lock


def lock_path(directory: str | Path) -> Path:
    """The lock file of ``directory``: beside it, ``.<name>.interq.lock``."""
    d = Path(os.path.abspath(directory))
    return d.parent / f".{d.name}{LOCK_SUFFIX}"


def _read_info(path: Path) -> dict:
    try:
        info = json.loads(path.read_text() or "{}")
        return info if isinstance(info, dict) else {}
    except (OSError, ValueError):
        return {}


def describe_holder(info: dict) -> str:
    if not info:
        return "another process (its lock file holds no owner)"
    started = info.get("started")
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(started)) if isinstance(started, (int, float)) else "?"
    return f"pid {info.get('pid', '?')} on {info.get('host', '?')} ({info.get('command', '?')}, since {when})"


def _ancestors() -> set[int]:
    """This process's parent, its parent, ... (Linux: /proc; elsewhere the parent only)."""
    out, pid = set(), os.getppid()
    for _ in range(64):
        if pid <= 1 or pid in out:
            break
        out.add(pid)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            pid = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return out


def _is_live(path: Path) -> bool:
    """Whether ``path`` is a lock some process holds now (a shared ``flock`` attempt fails)."""
    import fcntl

    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)  # closing drops the shared lock if it was taken
    return False


class _Held:
    def __init__(self, path: Path, fd: int, directory: Path) -> None:
        self.path, self.fd, self.directory, self.depth, self.pid = path, fd, directory, 1, os.getpid()


_HELD: dict[Path, _Held] = {}
_MUTEX = threading.Lock()


def _held_here(directory: Path) -> _Held | None:
    h = _HELD.get(directory)
    return h if h is not None and h.pid == os.getpid() else None


def _covered(directory: Path) -> bool:
    """``directory`` or one above it is held by this process."""
    return any(_held_here(p) is not None for p in (directory, *directory.parents))


def _check_neighbours(directory: Path) -> None:
    """Refuse when a directory above ``directory`` (or one or two levels below) is locked by another process that is
    not this process's ancestor (the compare command whose worker this is)."""
    mine = _ancestors() | {os.getpid()}
    above = [lock_path(p) for p in directory.parents if p != p.parent]
    below: list[Path] = []
    if directory.is_dir():
        below = [*directory.glob(f".*{LOCK_SUFFIX}"), *directory.glob(f"*/.*{LOCK_SUFFIX}")]
    for lp in [*above, *below]:
        if lp.is_file() and _is_live(lp):
            info = _read_info(lp)
            if info.get("pid") in mine and info.get("host") == socket.gethostname():
                continue
            where = "above it" if lp in above else "inside it"
            raise RunDirError(f"{directory} is in use: {lp.parent / lp.name[1:-len(LOCK_SUFFIX)]} ({where}) is being "
                              f"written by {describe_holder(info)}; nothing was run. Wait for it to finish, or use "
                              "another --out")


def acquire(directory: str | Path, command: str) -> bool:
    """Take ``directory``'s lock for this process (re-entrant). Returns False when this process held it already
    (or a directory above it). Raises :class:`RunDirError` when another process holds it, or a directory above or
    inside it."""
    import fcntl

    directory = Path(os.path.abspath(directory))
    with _MUTEX:
        h = _held_here(directory)
        if h is not None:
            h.depth += 1
            return False
        if _covered(directory):
            return False
        _check_neighbours(directory)
        path = lock_path(directory)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise RunDirError(f"--out {directory}: its parent directory cannot be created ({e.strerror or e})") from None
        for _ in range(20):
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as e:
                raise RunDirError(f"--out {directory}: cannot write beside it ({path.parent}: {e.strerror or e})") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise RunDirError(f"{directory} is being written by {describe_holder(_read_info(path))}; nothing was "
                                  f"run (lock {path}). Wait for it to finish, or use another --out") from None
            except OSError as e:  # a file system without flock (some network mounts): said, and run unlocked
                _say(f"[lock] {path}: this file system cannot lock files ({e.strerror or e}); {directory} is not "
                     "protected against a second writer")
                break
            try:  # the file we locked must still be the one at the path (not one a releasing owner just removed)
                same = os.fstat(fd).st_ino == os.stat(path).st_ino
            except FileNotFoundError:
                same = False
            if not same:
                os.close(fd)
                continue
            break
        else:  # pragma: no cover - a lock file replaced 20 times in a row
            raise RunDirError(f"{directory}: its lock {path} keeps changing; nothing was run")
        old = _read_info(path)
        if old:
            _say(f"[lock] {path}: taking over the lock of {describe_holder(old)}, which has ended")
        info = {"pid": os.getpid(), "host": socket.gethostname(), "command": command, "started": time.time()}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
        _HELD[directory] = _Held(path, fd, directory)
        return True


def release(directory: str | Path) -> None:
    """Give back one hold of ``directory``'s lock; the last one removes the lock file and unlocks it."""
    directory = Path(os.path.abspath(directory))
    with _MUTEX:
        h = _held_here(directory)
        if h is None:
            return
        h.depth -= 1
        if h.depth > 0:
            return
        del _HELD[directory]
        try:
            if os.fstat(h.fd).st_ino == os.stat(h.path).st_ino:
                os.unlink(h.path)
        except OSError:
            pass
        os.close(h.fd)


# ---------------------------------------------------------------------------------------------- --out


# What each command writes into its output directory (fnmatch patterns, top level); hidden names (temporary files
# of atomic writes, locks of the directories inside) never count as the user's.
WRITES: dict[str, tuple[str, ...]] = {
    "train": ("config.yaml", "provenance.json", "metrics.jsonl", "checkpoints", "checkpoints.stale-*", "warm_start",
              "warm_start.stale-*", "env_info.json", "machine.jsonl", "tensorboard"),
    "mismatch": ("mismatch.md", "mismatch.png", "mismatch.json", "config.yaml", "warm_start", "warm_start.stale-*"),
    # demo and compare write the same kind of directory (one may follow the other on the same --out)
    "demo": ("warm_start", "warm_start.stale-*", "demo.md", "demo.png", "compare.md", "summary.json", "curves*.png",
             "mismatch*.png"),
    "compare": ("warm_start", "warm_start.stale-*", "demo.md", "demo.png", "compare.md", "summary.json",
                "curves*.png", "mismatch*.png"),
    "eval": ("eval.md", "eval.json", "eval*.png", "config.yaml"),
}
OUTPUTS: dict[str, tuple[str, ...]] = {  # files a command writes whole at its end (a user's file there is refused)
    "mismatch": ("mismatch.md", "mismatch.png", "mismatch.json", "config.yaml"),
    "demo": ("demo.md", "demo.png", "mismatch.png", "summary.json"),
    "compare": ("compare.md", "summary.json"),
    "eval": ("eval.md", "eval.json", "config.yaml"),
}


def _is_run_dir(p: Path) -> bool:
    """A run directory interq wrote (a run, a warm start, a run moved aside)."""
    return p.is_dir() and any((p / n).is_file() for n in ("provenance.json", "policy_summary.json", "config.yaml"))


def _recognised(out: Path, command: str) -> bool:
    """``out`` shows interq's own results of ``command`` (so its output names are interq's, not the user's)."""
    if command == "train":
        return _is_run_dir(out) or _is_run_dir(out / "warm_start")
    if command in ("demo", "compare"):
        return (_is_run_dir(out / "warm_start") or any(_is_run_dir(p) for p in out.iterdir() if p.is_dir())
                or _starts_with(out / "compare.md", "Command: `interq ") or _summary_of_ours(out / "summary.json"))
    if command == "mismatch":
        return (out / "mismatch.json").is_file() or _is_run_dir(out / "warm_start")
    return (out / "config.yaml").is_file()


def _starts_with(path: Path, text: str) -> bool:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read(len(text)) == text
    except OSError:
        return False


def _summary_of_ours(path: Path) -> bool:
    """A ``summary.json`` that ``compare`` (a report, perhaps of nothing yet) or ``demo`` wrote."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and ({"regimes", "progress"} <= set(data) or {"summary", "result"} <= set(data))


def check_out(out: str | Path, command: str, force: bool = False) -> None:
    """Refuse (:class:`RunDirError`, one line) an output directory ``command`` cannot write safely; see the module
    docstring. ``sft``'s directory is a policy directory, checked by the warm start's own provenance check."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise RunDirError(f"--out {out} is a file, not a directory; nothing was run. Choose a directory")
    probe = out if out.is_dir() else next((p for p in out.parents if p.exists()), Path("."))
    if not probe.is_dir():
        raise RunDirError(f"--out {out}: {probe} is a file, not a directory; nothing was run")
    if not os.access(probe, os.W_OK | os.X_OK) or not _writable(probe):
        raise RunDirError(f"--out {out}: {probe} is not writable; nothing was run. Choose a writable directory")
    if not out.is_dir() or command == "sft":
        return
    visible = sorted(p.name for p in out.iterdir() if not p.name.startswith("."))
    if not visible:
        return
    ours = _recognised(out, command)
    patterns = WRITES.get(command, ())
    if ours:
        foreign = [n for n in visible if not any(fnmatch.fnmatchcase(n, pat) for pat in patterns)
                   and not (command in ("demo", "compare") and _is_run_dir(out / n))
                   and not (command in ("demo", "compare") and ".stale-" in n)]
    else:
        foreign = visible
    if not foreign:
        return
    shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
    if not force:
        raise RunDirError(f"--out {out} holds files interq {command} did not write ({shown}); nothing was run. Use an "
                          "empty or new directory, or pass --force to write beside them (none is overwritten)")
    clash = [n for n in foreign if n in OUTPUTS.get(command, ()) or n in ("config.yaml", "metrics.jsonl",
                                                                             "provenance.json", "checkpoints",
                                                                             "warm_start")]
    if clash:
        raise RunDirError(f"--out {out}: {', '.join(clash)} would be overwritten by interq {command} but was not "
                          "written by it; nothing was run. Move it away or use another --out")


def _writable(d: Path) -> bool:
    """Whether a file can really be created in ``d`` (os.access says yes to root on a read-only mount)."""
    import tempfile

    try:
        with tempfile.TemporaryFile(dir=d):
            return True
    except OSError:
        return False


# ---------------------------------------------------------------------------------------------- a command's scope


_SCOPE: dict = {"depth": 0, "command": None, "dirs": []}


_COMMAND: dict = {"argv": None, "pid": None}


@contextlib.contextmanager
def running(argv: list[str]):
    """The command line (``[command, *args]``) being run in this process, for the messages that say how to resume
    (the command line calls its commands inside this; also right for ``interq.cli.main([...])`` from Python). Also
    turns SIGTERM into an interruption, and an interruption before any run directory was taken into one line."""
    saved = dict(_COMMAND)
    _COMMAND.update(argv=list(argv), pid=os.getpid())
    old = None
    if threading.current_thread() is threading.main_thread():
        old = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        yield
    except KeyboardInterrupt as e:
        sig = "SIGTERM" if isinstance(e, Interrupted) else "Ctrl-C"
        _say(f"interq {argv[0] if argv else ''}: stopped by {sig} before it wrote anything")
        raise SystemExit(143 if isinstance(e, Interrupted) else 130) from None
    finally:
        if old is not None:
            signal.signal(signal.SIGTERM, old)
        _COMMAND.update(saved)


def command_line() -> str:
    """The command line that started this process, as ``interq ...`` (what resumes a run)."""
    argv = list(sys.argv)
    if _SCOPE.get("argv") is not None:
        return "interq " + shlex.join(_SCOPE["argv"])
    if _COMMAND["argv"] is not None and _COMMAND["pid"] == os.getpid():
        return "interq " + shlex.join(_COMMAND["argv"])
    if argv and (Path(argv[0]).name == "interq" or Path(argv[0]).parts[-2:] == ("interq", "__main__.py")):
        return "interq " + shlex.join(argv[1:])
    return "the same command"


def where_stopped(directory: Path) -> str:
    """Where the run in ``directory`` stands: its last checkpoint and its last record."""
    parts = []
    ck = directory / "checkpoints" / "latest"
    try:
        parts.append(f"last checkpoint {ck.read_text().strip()}")
    except OSError:
        parts.append("no checkpoint")
    try:
        from interq.train.logging import read_jsonl

        recs = read_jsonl(directory / "metrics.jsonl")
        if recs:
            parts.append(f"last record step {recs[-1].get('step')}")
    except (OSError, ValueError):
        pass
    return f"{directory} ({', '.join(parts)})"


def _on_sigterm(signum, frame):  # noqa: ARG001
    raise Interrupted()


@contextlib.contextmanager
def scope(command: str, directories: Iterable[str | Path] = (), force: bool = False, check: bool = True,
          argv: list[str] | None = None):
    """Run a command that writes ``directories``: the environment switches checked, each directory checked
    (:func:`check_out`, unless ``check`` is False) and locked, SIGTERM turned into an interruption; at the end the
    locks are given back and an interruption ends the process with one line (exit 130 / 143). Nested scopes (a
    command calling another's code) share the outermost one."""
    from interq import switches

    dirs = [Path(d) for d in directories]
    outer = _SCOPE["depth"] == 0 or _SCOPE.get("pid") != os.getpid()
    if outer:
        _SCOPE.update(depth=0, command=command, dirs=[], pid=os.getpid(), argv=argv, entered=[])
        switches.check_environment()
    for d in dirs:
        if check and not _covered(Path(os.path.abspath(d))):
            check_out(d, command, force)
    taken: list[Path] = []
    old_handler = None
    try:
        for d in dirs:
            acquire(d, command_line() if outer else command)
            taken.append(d)
        if outer:
            _SCOPE["dirs"] += dirs  # where an interruption says the run stopped: the command's own directories
        if outer and threading.current_thread() is threading.main_thread():
            old_handler = signal.signal(signal.SIGTERM, _on_sigterm)
        _SCOPE["depth"] += 1
        try:
            yield
        finally:
            _SCOPE["depth"] -= 1
    except KeyboardInterrupt as e:
        if not outer:
            raise
        sig = "SIGTERM" if isinstance(e, Interrupted) else "Ctrl-C"
        where = "; ".join(where_stopped(d) for d in _SCOPE["dirs"]) or "nothing written yet"
        _say(f"interq {command}: stopped by {sig} at {where}; resume with: {command_line()}")
        raise SystemExit(143 if isinstance(e, Interrupted) else 130) from None
    finally:
        if old_handler is not None:
            signal.signal(signal.SIGTERM, old_handler)
        for d in reversed(taken):
            release(d)
        if outer:
            for d in reversed(_SCOPE.get("entered", [])):
                release(d)
            _SCOPE.update(depth=0, dirs=[], argv=None, entered=[])


def enter(directory: str | Path, command: str, force: bool = False) -> None:
    """Inside a :func:`scope` whose directory was known only later (``mismatch``'s default ``--out`` depends on the
    config): check and lock ``directory`` until the scope ends."""
    d = Path(directory)
    if _SCOPE["depth"] == 0 or _SCOPE.get("pid") != os.getpid():  # no scope: held until the process ends
        import atexit

        if not _covered(Path(os.path.abspath(d))):
            check_out(d, command, force)
        if acquire(d, command_line()):
            atexit.register(release, d)
        return
    if not _covered(Path(os.path.abspath(d))):
        check_out(d, command, force)
    if acquire(d, command_line()):
        _SCOPE["entered"].append(d)
    else:
        release(d)  # a re-entrant hold: given back at once, the outer holder keeps it
    _SCOPE["dirs"].append(d)


def command(name: str, default_out: str | None = None) -> Callable:
    """Decorate a command's ``main(argv)`` (demo, compare, eval): its ``--out`` (or ``default_out``) is checked and
    locked, and it runs in :func:`scope`. ``--force`` is read from ``argv``."""

    def deco(fn):
        @functools.wraps(fn)
        def wrapper(argv: list[str]) -> int:
            if any(a in ("-h", "--help") or a.startswith("--help-config") for a in argv):
                return fn(argv)  # help only: nothing is written, so no --out is taken
            out, force = default_out, False
            for i, a in enumerate(argv):
                if a == "--out" and i + 1 < len(argv):
                    out = argv[i + 1]
                elif a.startswith("--out="):
                    out = a.split("=", 1)[1]
                elif a == "--force":
                    force = True
            report = "--report-only" in argv
            with scope(name, [] if out is None or report else [out], force=force,
                       argv=[name, *argv] if _SCOPE["depth"] == 0 else None):
                code = fn(argv)
            if code == 0:
                _say(f"[{name}] {peak_memory_line()}")
            return code

        return wrapper

    return deco


def peak_memory_line() -> str:
    """Peak resident memory of this process (``getrusage``'s ``ru_maxrss``)."""
    return f"peak memory (ru_maxrss): {peak_rss_mib():.0f} MiB"


def peak_rss_mib() -> float:
    """Peak resident memory of this process in MiB (Linux reports ``ru_maxrss`` in KiB, macOS in bytes)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024) / 2**20
