"""Kill ``interq train`` at chosen points: a helper process for tests/test_train_kill.py (run as a script).

Starting ``python -m interq train`` costs about 4 s of imports on a 2-core machine, so 20 kills of fresh processes
would spend most of a CI-sized test importing. This script imports interq, torch and transformers once, then, for
every job it reads on stdin (one JSON object a line), forks a child that runs ``interq.cli.main(argv)`` (exactly what
``python -m interq train ...`` runs; the child starts from the same imported-but-unused state every time), kills it
with SIGKILL at the job's point, reaps it and answers one JSON line on stdout.

Where a job kills (``plan``):

- ``{"kind": "none"}``: no kill (the run ends by itself).
- ``{"kind": "phase", "phase": "train>update", "nth": 2, "delay": 0.004}``: ``delay`` seconds after the child has
  entered that phase for the ``nth`` time, this process SIGKILLs it. Phases are marked by wrappers around the
  trainer's functions (numerics untouched): ``warm_start`` (:func:`~interq.train.pipeline.prepare_policy`, with
  ``>demos``, ``>tokenizer``, ``>sft`` inside), ``train`` (:func:`~interq.train.rl.train`, with ``>resume``,
  ``>rollout``, ``>update``, ``>eval`` (its own ``>rollout``) and ``>checkpoint`` inside).
- ``{"kind": "new_step", "lines_before": 7, "delay": 0.1}``: ``delay`` seconds after ``metrics.jsonl`` first holds
  more than ``lines_before`` lines (a step beyond every earlier attempt was logged), this process SIGKILLs the child.
- ``{"kind": "fileop", "phase": "checkpoint", "save": 2, "op": 17}``: the child SIGKILLs itself at the ``op``-th file
  operation (an ``open``, ``mkdir``, rename, remove) under the run directory during its ``save``-th checkpoint write
  (``phase": "warm_start"``: during the warm start), before the operation runs; or at the end of that write if it
  has fewer. This is "a kill between the file writes of a checkpoint", independent of how the writer is built.

The answer: ``returncode`` (``-9`` when killed), ``killed``, ``phase`` (where the child was when it died: the
innermost phase path, e.g. ``train>checkpoint``), ``events`` (``resumed <step>`` / ``resumed none`` when the run's
resume returned, ``saved <step> ops <n>`` after each checkpoint write returned (with its number of file operations),
``warm_start done ops <n>``, ``killed at <where>``).
The child's stdout and stderr go to the job's ``log`` file.
"""

from __future__ import annotations

import json
import mmap
import os
import signal
import sys
import time
import traceback

MARKER_BYTES = 1 << 14
FILE_OPS = frozenset({"open", "os.mkdir", "os.rename", "os.remove", "os.rmdir", "shutil.rmtree", "os.truncate"})


def _write_marker(marker: mmap.mmap, stack: list[str], counts: dict[str, int]) -> None:
    data = json.dumps({"path": ">".join(stack), "counts": counts}).encode()[: MARKER_BYTES - 1]
    marker.seek(0)
    marker.write(data + b"\0")


def read_marker(marker: mmap.mmap) -> dict | None:
    raw = marker[:MARKER_BYTES].split(b"\0", 1)[0]
    try:
        return json.loads(raw) if raw else None
    except ValueError:  # caught mid-write: the next poll reads it whole
        return None


def _child(job: dict, marker: mmap.mmap) -> None:
    """In the forked child: mark phases, arm the file-operation kill if asked, run ``interq.cli.main``."""
    fd = os.open(job["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    events = os.open(job["events"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def event(text: str) -> None:  # one write(2): on disk (page cache) even if SIGKILL follows at once
        os.write(events, (text + "\n").encode())

    from interq.cli import main
    from interq.train import build, checkpoint, pipeline, policy, rl, sft

    plan = job.get("plan") or {}
    run_dir = os.path.realpath(job["run_dir"])
    stack: list[str] = []
    counts: dict[str, int] = {}
    writes = {"checkpoint": [0, 0], "warm_start": [0, 0]}  # label -> [writes begun, file operations in the current]

    def die(where: str) -> None:
        event(f"killed at {where}")
        os.kill(os.getpid(), signal.SIGKILL)

    def planned(label: str) -> bool:  # this is the write the plan kills in
        return plan.get("kind") == "fileop" and plan["phase"] == label and writes[label][0] == plan["save"]

    def wrap(mod, name: str, label: str, after=None) -> None:
        fn = getattr(mod, name, None)
        if fn is None:  # an older trainer without this function (e.g. before resume_checkpoint): not marked
            return

        def wrapper(*args, **kwargs):
            stack.append(label)
            path = ">".join(stack)
            counts[path] = counts.get(path, 0) + 1
            if label in writes:
                writes[label][0] += 1
                writes[label][1] = 0
            _write_marker(marker, stack, counts)
            try:
                out = fn(*args, **kwargs)
            finally:
                stack.pop()
                _write_marker(marker, stack, counts)
            if label in writes and planned(label):
                die(f"the end of {label} {writes[label][0]} (after its {writes[label][1]} file operations)")
            if after is not None:
                after(out, args, kwargs)
            return out

        setattr(mod, name, wrapper)

    def ops(label: str) -> str:
        return f"ops {writes[label][1]}"

    wrap(pipeline, "prepare_policy", "warm_start", lambda *_: event(f"warm_start done {ops('warm_start')}"))
    wrap(build, "collect_demos", "demos")
    wrap(policy, "build_tiny_policy", "tokenizer")
    wrap(sft, "run_sft", "sft")
    wrap(rl, "train", "train")
    resume = next(n for n in ("resume_run", "resume_checkpoint", "load_checkpoint") if hasattr(checkpoint, n))  # older trainers: the later names
    wrap(checkpoint, resume, "resume", lambda st, *_: event(f"resumed {st['step'] if st is not None else 'none'}"))
    wrap(rl, "rollout", "rollout")
    wrap(rl, "update", "update")
    wrap(rl, "evaluate", "eval")
    wrap(checkpoint, "save_checkpoint", "checkpoint",
         lambda _, a, k: event(f"saved {a[1] if len(a) > 1 else k['step']} {ops('checkpoint')}"))

    def audit(name: str, args: tuple) -> None:  # counts (and, if planned, dies at) file operations of a write
        if name not in FILE_OPS:
            return
        label = "checkpoint" if "checkpoint" in stack else "warm_start" if "warm_start" in stack else None
        if label is None:
            return
        target = os.fspath(args[0]) if args and isinstance(args[0], (str, bytes, os.PathLike)) else ""
        if isinstance(target, bytes):
            target = target.decode(errors="replace")
        target = os.path.realpath(target)
        if not target.startswith(run_dir):
            return
        writes[label][1] += 1
        if planned(label) and writes[label][1] == plan["op"]:
            die(f"{name} {os.path.relpath(target, run_dir)} ({label} {writes[label][0]}, file operation "
                f"{writes[label][1]})")

    sys.addaudithook(audit)

    code = 1
    try:
        code = main(job["argv"])
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:  # noqa: BLE001 - reported through the exit code and the log
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code or 0)


def _lines(path: str) -> int:
    try:
        with open(path, "rb") as f:
            return f.read().count(b"\n")
    except FileNotFoundError:
        return 0


def run_job(job: dict) -> dict:
    marker = mmap.mmap(-1, MARKER_BYTES)  # anonymous, shared with the child across fork
    open(job["events"], "w").close()
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        try:
            _child(job, marker)
        finally:
            os._exit(1)
    plan = job.get("plan") or {}
    kind = plan.get("kind", "none")
    metrics = os.path.join(job["run_dir"], "metrics.jsonl")
    deadline = time.monotonic() + float(job.get("timeout_s", 300))
    fire_at = None
    killed = timed_out = False
    status = None
    while status is None:
        done, st = os.waitpid(pid, os.WNOHANG)
        if done:
            status = st
            break
        now = time.monotonic()
        if fire_at is None:
            if kind == "phase":
                m = read_marker(marker)
                if m is not None and m["counts"].get(plan["phase"], 0) >= plan["nth"]:
                    fire_at = now + plan["delay"]
            elif kind == "new_step" and _lines(metrics) > plan["lines_before"]:
                fire_at = now + plan["delay"]
        if (fire_at is not None and now >= fire_at) or now > deadline:
            timed_out = fire_at is None or now < fire_at
            os.kill(pid, signal.SIGKILL)  # still our unreaped child: the pid cannot have been reused
            killed = True
            _, status = os.waitpid(pid, 0)
            break
        time.sleep(0.0005)
    m = read_marker(marker) or {"path": "", "counts": {}}
    with open(job["events"]) as f:
        events = [ln.strip() for ln in f if ln.strip()]
    return {"pid": pid, "returncode": os.waitstatus_to_exitcode(status), "killed": killed or any(
        e.startswith("killed at") for e in events), "timed_out": timed_out, "phase": m["path"], "events": events}


def main() -> None:
    # everything `interq train` on the toy env imports, once, before any fork (no torch op runs here)
    import interq.agent.loop  # noqa: F401
    import interq.agent.toy_env  # noqa: F401
    import interq.cli  # noqa: F401
    import interq.rollout  # noqa: F401
    import interq.train.build  # noqa: F401
    import interq.train.checkpoint  # noqa: F401
    import interq.train.pipeline  # noqa: F401
    import interq.train.policy  # noqa: F401
    import interq.train.provenance  # noqa: F401
    import interq.train.rl  # noqa: F401
    import interq.train.sft  # noqa: F401
    import safetensors.torch  # noqa: F401
    import tokenizers  # noqa: F401
    from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast, Qwen3Config  # noqa: F401
    from transformers import Qwen3ForCausalLM  # noqa: F401

    print(json.dumps({"ready": os.getpid()}), flush=True)
    for line in sys.stdin:
        if line.strip():
            print(json.dumps(run_job(json.loads(line))), flush=True)


if __name__ == "__main__":
    main()
