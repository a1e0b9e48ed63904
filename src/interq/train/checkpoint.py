"""Crash-safe checkpoints: a run killed at any point resumes from its newest complete checkpoint.

Layout of ``<run_dir>/checkpoints/step_000012/``: ``model.safetensors`` + ``config.json`` + tokenizer files
(a normal transformers directory, loadable with :func:`interq.train.policy.load_policy`), ``optimizer.pt``,
``rng.pt`` (python, numpy, torch CPU generator states), ``state.json`` (step, anything the loop needs),
``run_config.yaml`` and, written last, ``manifest.json`` (size and SHA-256 of every other file).
``optimizer.pt`` and ``rng.pt`` hold only tensors, dicts, lists, tuples, strings and numbers, and every ``.pt``
file is read with ``torch.load(weights_only=True)``: loading a checkpoint runs no code from it.

Writing (:func:`save_checkpoint`): every file is written into a temporary folder ``.tmp_step_*`` and fsynced, the
folder is renamed to ``step_*`` and the directory fsynced, then ``checkpoints/latest`` (one line: the folder's
name) is replaced atomically, and only then are older checkpoints pruned. A checkpoint being replaced (the same
step written again after a fallback) is first renamed to ``.replaced_step_*`` and removed only once the new one
is in place. Once one checkpoint has been written, a complete one exists at every instant.

Reading (:func:`resume_checkpoint`, :func:`resume_run`): the checkpoint ``latest`` names, then the older ones newest first, each
checked against its manifest (every file present, sizes and hashes equal; one of the earlier format, without a
manifest, must hold weights, ``config.json``, ``state.json``, ``rng.pt`` and ``optimizer.pt`` that all load).
An incomplete or corrupted one is skipped with a line on stderr naming it and what is wrong, and the previous
complete one is loaded. :func:`load_checkpoint` of a single checkpoint raises :class:`CheckpointError` instead.

What resume guarantees (:func:`interq.train.rl.train`; ``tests/test_train_checkpoint.py`` crashes a save at each
of its file operations, damages checkpoints and tears the last metrics line): a run stopped at any point (killed,
or the machine crashing on a file system that honours fsync) and started again with the same command continues
from the checkpoint ``latest`` names or, if that one is incomplete or corrupted, the previous complete one (step
``s``), with the weights, optimizer state, RNG states and step saved there. ``metrics.jsonl`` then keeps exactly
one record of each step up to ``s`` (each is fsynced before its checkpoint is written; a torn last line is
dropped and said; records of later steps are dropped and those steps run again), so the finished run holds one
record per step and, on CPU, the same numbers as an uninterrupted run (timings aside). The log is checked against
the checkpoints (:func:`resume_run`): the checkpoint resumed from is the newest complete one whose every earlier
step has its record; a record lost or damaged anywhere (a torn line, an edit, a deleted log) is recomputed by
resuming from the newest checkpoint before it, and where no checkpoint precedes it the resume is refused before
anything changes, with the command that recomputes the run from step 0 (``--no-resume``). A run started over
(``--no-resume``, or no complete checkpoint left) keeps nothing of the earlier attempt: its records are dropped and
``checkpoints/`` is moved aside to ``checkpoints.stale-<time>``. A checkpoint that cannot be written (a full disk)
stops the run with one line (:class:`SaveError`); the previous checkpoints stay intact. Weights that are not
finite are never written. Not saved: CUDA generator states.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import secrets
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from interq.train.atomic import fsync_path as _fsync_path
from interq.train.atomic import write_text_atomic as _write_text_atomic
from interq.train.config import ConfigError, RunConfig, save_config

FORMAT = 2  # 1: no manifest, numpy RNG state pickled as an ndarray (still read)
MANIFEST = "manifest.json"
WEIGHTS = "model.safetensors"
REQUIRED = (WEIGHTS, "config.json", "state.json", "rng.pt")  # plus optimizer.pt when an optimizer is restored
_STEP_DIR = re.compile(r"^(?:\.replaced_)?step_(\d+)(?:_.*)?$")


class CheckpointError(RuntimeError):
    """A checkpoint is incomplete or corrupted; the message names its path and what is missing or wrong."""


def _run_dir_error():
    from interq.rundir import RunDirError

    return RunDirError


class SaveError(_run_dir_error()):
    """A checkpoint or warm start could not be written (disk full, I/O error); what was there is intact. One line."""


def save_failure(e: BaseException, what: str, where: Path) -> SaveError:
    """The one-line :class:`SaveError` of a write that failed with ``e`` (ENOSPC, an I/O error, torch's "unexpected
    pos", the tokenizer's own error)."""
    try:
        free = f"{shutil.disk_usage(where).free / 2**20:.0f} MiB free there now"
    except OSError:
        free = "free space unknown"
    why = e.strerror if isinstance(e, OSError) and e.strerror else " ".join(str(e).split())[:160]
    return SaveError(f"{what} could not be written to {where} ({why}; {free}); nothing of it was kept and what was "
                     "there before is intact. Free space, then run the same command again (it resumes)")


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------- RNG state


def rng_state() -> dict:
    """Python, numpy and torch generator states as plain tuples, dicts, numbers and tensors (``weights_only``
    loadable; numpy's would pickle an ndarray)."""
    npst = np.random.get_state(legacy=False)  # numpy's dict layout, the uint32 key as an int64 tensor
    return {"python": random.getstate(),  # (version, tuple of ints, None or float): plain data
            "numpy": {"bit_generator": npst["bit_generator"],
                      "state": {"key": torch.from_numpy(npst["state"]["key"].astype(np.int64)),
                                "pos": int(npst["state"]["pos"])},
                      "has_gauss": int(npst["has_gauss"]), "gauss": float(npst["gauss"])},
            "torch": torch.get_rng_state()}


def set_rng_state(state: dict) -> None:
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
    npst = state["numpy"]
    if isinstance(npst, dict):
        key = np.asarray(npst["state"]["key"], dtype=np.int64).astype(np.uint32)
        np.random.set_state({**npst, "state": {**npst["state"], "key": key}})
    else:  # format 1: numpy's tuple (an ndarray inside)
        np.random.set_state(tuple(npst))
    torch.set_rng_state(state["torch"])


def _load_pt(path: Path, legacy_numpy: bool = False):
    """``torch.load(weights_only=True)``; a format-1 ``rng.pt`` also needs numpy's array reconstructor allowed."""
    if not legacy_numpy:
        return torch.load(path, map_location="cpu", weights_only=True)
    core = getattr(np, "_core", None) or np.core
    allowed = [core.multiarray._reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]
    with torch.serialization.safe_globals(allowed):
        return torch.load(path, map_location="cpu", weights_only=True)


# ---------------------------------------------------------------------------------------------- writing


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _step_of(p: Path) -> int | None:
    m = _STEP_DIR.match(p.name)
    return int(m.group(1)) if m and p.is_dir() else None


def save_checkpoint(run_dir: str | Path, step: int, model, tokenizer, optimizer, cfg: RunConfig,
                    state: dict[str, Any] | None = None, keep: int = 2) -> Path:
    """Write checkpoint ``step`` crash-safely (module docstring); keep the ``keep`` most recent ones."""
    from interq.train.policy import save_policy

    ckdir = Path(run_dir) / "checkpoints"
    ckdir.mkdir(parents=True, exist_ok=True)
    final = ckdir / f"step_{step:06d}"
    tmp = Path(tempfile.mkdtemp(dir=ckdir, prefix=f".tmp_step_{step:06d}_"))
    try:
        save_policy(model, tokenizer, tmp)
        if optimizer is not None:
            torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        torch.save(rng_state(), tmp / "rng.pt")
        (tmp / "state.json").write_text(json.dumps({"step": step, **(state or {})}, indent=1))
        save_config(cfg, tmp / "run_config.yaml")
        files = sorted(p for p in tmp.rglob("*") if p.is_file())
        for p in files:
            _fsync_path(p)
        manifest = {"format": FORMAT, "step": step,
                    "files": {p.relative_to(tmp).as_posix(): {"bytes": p.stat().st_size, "sha256": _sha256(p)}
                              for p in files}}
        _write_text_atomic(tmp / MANIFEST, json.dumps(manifest, indent=1) + "\n")
        _fsync_path(tmp)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, Exception) and not isinstance(e, (CheckpointError, ConfigError)):
            # a full disk, a quota, an I/O error (torch says "unexpected pos"): one line, the previous checkpoint kept
            raise save_failure(e, f"checkpoint of step {step}", ckdir) from None
        raise
    if final.exists():  # moved aside, not deleted: until the new one is in place it stays a fallback
        os.replace(final, ckdir / f".replaced_{final.name}_{secrets.token_hex(4)}")
    os.replace(tmp, final)
    _fsync_path(ckdir)
    _write_text_atomic(ckdir / "latest", final.name + "\n")
    # only now: the older ones beyond ``keep``, anything replaced, steps past this one (an abandoned attempt) and
    # what a save cut by a crash left
    older = sorted((s, p) for p in ckdir.iterdir() if (s := _step_of(p)) is not None and p != final)
    prune = [p for s, p in older if s > step or p.name.startswith(".replaced_")]
    prune += [p for p in ckdir.glob(".tmp_step_*") if p.is_dir()]
    before = [p for s, p in older if s < step and p.name.startswith("step_")]
    prune += before[: max(0, len(before) - (keep - 1))]
    for p in prune:
        shutil.rmtree(p, ignore_errors=True)
    return final


# ---------------------------------------------------------------------------------------------- reading


def check_checkpoint(path: str | Path, need_optimizer: bool = True) -> None:
    """Raise :class:`CheckpointError` unless ``path`` is a complete, uncorrupted checkpoint (sizes and hashes
    against its manifest; a format-1 checkpoint: the required files present). ``need_optimizer``: refuse one
    without ``optimizer.pt``."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"checkpoint {path} does not exist")
    required = REQUIRED + (("optimizer.pt",) if need_optimizer else ())
    if not (path / MANIFEST).is_file():  # format 1
        missing = [n for n in required if not (path / n).is_file()]
        if missing:
            raise CheckpointError(f"checkpoint {path} is incomplete: missing {', '.join(missing)}")
        return
    try:
        files = json.loads((path / MANIFEST).read_text())["files"]
        assert isinstance(files, dict) and all(isinstance(v, dict) for v in files.values())
    except (OSError, ValueError, KeyError, TypeError, AssertionError) as e:
        raise CheckpointError(f"checkpoint {path} is corrupted: unreadable {MANIFEST} ({e!r})") from None
    missing = [n for n in files if not (path / n).is_file()]
    missing += [n for n in required if n not in files and n not in missing]
    if missing:
        what = "; ".join(f"{n} (saved without an optimizer)" if n not in files and n == "optimizer.pt" else n
                         for n in missing)
        raise CheckpointError(f"checkpoint {path} is incomplete: missing {what}")
    bad = []
    for name, rec in files.items():
        p = path / name
        size = p.stat().st_size
        if size != rec.get("bytes"):
            bad.append(f"{name} has {size} bytes, {rec.get('bytes')} written")
        elif _sha256(p) != rec.get("sha256"):
            bad.append(f"{name} content differs from what was written (SHA-256)")
    if bad:
        raise CheckpointError(f"checkpoint {path} is corrupted: {'; '.join(bad)}")


def _read(path: Path, name: str, reader: Callable[[Path], Any]):
    try:
        return reader(path / name)
    except CheckpointError:
        raise
    except Exception as e:  # a truncated or damaged file: whatever the reader raises, said with its path
        raise CheckpointError(f"checkpoint {path} is corrupted: {name} cannot be read ({type(e).__name__}: "
                              f"{str(e).splitlines()[0] if str(e) else ''})") from e


def load_checkpoint(path: str | Path, model, optimizer=None, restore_rng: bool = True) -> dict:
    """Load weights (and optimizer, RNG) from a checkpoint directory into existing objects; return state.

    Raises :class:`CheckpointError` (its path and what is missing or wrong) for an incomplete or corrupted
    checkpoint, and before anything is changed: every file is read and checked first."""
    from safetensors.torch import load_file

    path = Path(path)
    check_checkpoint(path, need_optimizer=optimizer is not None)
    legacy = not (path / MANIFEST).is_file()
    weights = _read(path, WEIGHTS, lambda p: load_file(str(p)))
    opt_state = _read(path, "optimizer.pt", _load_pt) if optimizer is not None else None
    rng = _read(path, "rng.pt", lambda p: _load_pt(p, legacy_numpy=legacy)) if restore_rng else None
    state = _read(path, "state.json", lambda p: json.loads(p.read_text()))
    if not isinstance(state, dict) or not isinstance(state.get("step"), int):
        raise CheckpointError(f"checkpoint {path} is corrupted: state.json holds no integer 'step'")
    own = model.state_dict()
    wrong = [f"{k} {list(v.shape)} (the model's: {list(own[k].shape)})" for k, v in weights.items()
             if k in own and tuple(v.shape) != tuple(own[k].shape)]
    tie = getattr(model.config, "tie_word_embeddings", False)
    absent = [k for k in own if k not in weights and not ("lm_head" in k and tie)]
    foreign = [k for k in weights if k not in own]
    if absent or foreign:
        raise CheckpointError(f"checkpoint {path} does not match the model: missing {absent[:3]}, unexpected {foreign[:3]}")
    if wrong:  # checked before anything is copied: a checkpoint of another model changes nothing
        raise CheckpointError(f"checkpoint {path} does not match the model: {len(wrong)} tensors of other shapes "
                              f"({'; '.join(wrong[:2])})")
    missing, unexpected = model.load_state_dict(weights, strict=False)
    # tied embeddings are saved once; anything else missing is an error
    tied = {k for k in missing if "lm_head" in k and getattr(model.config, "tie_word_embeddings", False)}
    if set(missing) - tied or unexpected:
        raise CheckpointError(f"checkpoint {path} does not match the model: missing {sorted(set(missing) - tied)}, unexpected {unexpected}")
    if optimizer is not None:
        optimizer.load_state_dict(opt_state)
    if rng is not None:
        set_rng_state(rng)
    return state


def _candidates(run_dir: str | Path) -> list[Path]:
    """Checkpoints to try, best first: the one ``latest`` names, then every older one by step (newest first).
    Folders past ``latest``'s step are ignored (an abandoned attempt, or a save cut before ``latest`` moved)."""
    ckdir = Path(run_dir) / "checkpoints"
    if not ckdir.is_dir():
        return []
    found = [(s, not p.name.startswith("step_"), p) for p in ckdir.iterdir() if (s := _step_of(p)) is not None]
    found.sort(key=lambda t: (-t[0], t[1], t[2].name))  # newest first; at equal step the live one before one replaced
    pointer = ckdir / "latest"
    try:
        name = pointer.read_text().strip() if pointer.is_file() else ""
    except (OSError, ValueError):
        name = ""
    m = _STEP_DIR.match(name)
    if m and name.startswith("step_"):
        top = int(m.group(1))
        first = [ckdir / name] if (ckdir / name).is_dir() else []
        return first + [p for s, _, p in found if s <= top and p != ckdir / name]
    return [p for _, _, p in found]


def latest_checkpoint(run_dir: str | Path, need_optimizer: bool = False,
                      log: Callable[[str], Any] = _stderr) -> Path | None:
    """The newest complete checkpoint of ``run_dir`` (its files all there, sizes and hashes right; with
    ``need_optimizer`` also an ``optimizer.pt``), or None; each one skipped is said with ``log``."""
    for p in _candidates(run_dir):
        try:
            check_checkpoint(p, need_optimizer)
            return p
        except CheckpointError as e:
            log(f"[resume] {e}; skipped, trying the previous checkpoint")
    return None


def resume_checkpoint(run_dir: str | Path, model, optimizer=None, log: Callable[[str], Any] = _stderr) -> dict | None:
    """Load the newest complete checkpoint of ``run_dir`` into ``model``/``optimizer`` (and the RNGs); return its
    state, or None when there is none. An incomplete or corrupted one is skipped with a line in ``log`` naming it
    and what is wrong, and the previous complete one is loaded instead."""
    tried = []
    for p in _candidates(run_dir):
        try:
            state = load_checkpoint(p, model, optimizer)
        except CheckpointError as e:
            log(f"[resume] {e}; skipped, trying the previous checkpoint")
            tried.append(p.name)
            continue
        if tried:
            log(f"[resume] resuming from {p} (step {state['step']}), the newest complete checkpoint "
                f"(skipped: {', '.join(tried)})")
        return state
    if tried:
        log(f"[resume] no complete checkpoint in {Path(run_dir) / 'checkpoints'} (skipped: {', '.join(tried)}); "
            f"the run starts over from step 0")
    return None


class ResumeError(_run_dir_error()):
    """A run cannot be resumed without losing a record; the message says the exact command that recomputes it."""


def _steps_text(steps: list[int]) -> str:
    runs, start = [], None
    for i, s in enumerate(steps):
        if start is None:
            start = s
        if i + 1 == len(steps) or steps[i + 1] != s + 1:
            runs.append(str(start) if start == s else f"{start}-{s}")
            start = None
    return ", ".join(runs[:6]) + (", ..." if len(runs) > 6 else "")


def check_resumable(run_dir: str | Path, first_step: int, repair: str, need_optimizer: bool = True) -> None:
    """Before anything of a run is touched: :class:`ResumeError` (with ``repair``) when resuming it would leave out a
    record (:func:`resume_run`'s rule, checked on the files alone)."""
    from interq.train.logging import scan_jsonl

    run_dir = Path(run_dir)
    records, bad = scan_jsonl(run_dir / "metrics.jsonl")
    have = {r["step"] for r in records if isinstance(r.get("step"), int) and not isinstance(r.get("step"), bool)}
    gaps = []
    for p in _candidates(run_dir):
        try:
            check_checkpoint(p, need_optimizer=need_optimizer)
        except CheckpointError:
            continue
        lost = [k for k in range(first_step, (_step_of(p) or 0) + 1) if k not in have]
        if not lost:
            return
        gaps.append(lost)
    if gaps:
        why = f"{len(bad)} damaged lines, " if bad else ""
        raise ResumeError(f"{run_dir / 'metrics.jsonl'} lacks the records of steps {_steps_text(gaps[0])} ({why}lost "
                          f"or edited) and no checkpoint of {run_dir} comes before them, so resuming would leave them "
                          "out; nothing was changed. Recompute the run from step 0 (deterministic: the same numbers) "
                          f"with: {repair}")


def resume_run(run_dir: str | Path, model, optimizer, first_step: int, repair: str,
               log: Callable[[str], Any] = _stderr) -> dict | None:
    """Resume a run without losing a record: load the newest complete checkpoint (step ``s``) for which
    ``metrics.jsonl`` holds a record of every step ``first_step .. s`` (``first_step``: 0 when step 0's evaluation
    is logged, else 1), and rewrite the log to hold exactly those records, once each; return its state.

    A line that is not a record (torn at a crash or edited), anywhere in the log, is dropped and said; the steps
    whose records are lost are then recomputed by resuming from the newest checkpoint before them (a run is
    deterministic: the same numbers). When no checkpoint precedes a lost record, :class:`ResumeError` says so and
    gives ``repair`` (the command that recomputes the run from step 0); nothing was changed. None when the run has
    no complete checkpoint (it starts over, as :func:`resume_checkpoint`)."""
    from interq.train.logging import scan_jsonl, write_records

    run_dir = Path(run_dir)
    metrics = run_dir / "metrics.jsonl"
    records, bad = scan_jsonl(metrics)
    have: dict[int, dict] = {}
    for r in records:
        if isinstance(r.get("step"), int) and not isinstance(r.get("step"), bool):
            have[r["step"]] = r  # a step recorded twice keeps its last record (the attempt its checkpoint came from)
    tried, gaps = [], []
    for p in _candidates(run_dir):
        step = _step_of(p)
        try:
            check_checkpoint(p, need_optimizer=optimizer is not None)
        except CheckpointError as e:
            log(f"[resume] {e}; skipped, trying the previous checkpoint")
            tried.append(p.name)
            continue
        lost = [k for k in range(first_step, (step or 0) + 1) if k not in have]
        if lost:
            gaps.append((p, lost))
            tried.append(p.name)
            continue
        try:
            state = load_checkpoint(p, model, optimizer)
        except CheckpointError as e:
            log(f"[resume] {e}; skipped, trying the previous checkpoint")
            tried.append(p.name)
            continue
        s = state["step"]
        keep = [have[k] for k in range(first_step, s + 1)]
        if bad:
            log(f"[resume] {metrics}: {'; '.join(bad[:3])}{'; ...' if len(bad) > 3 else ''}: dropped")
        if gaps:
            log(f"[resume] {metrics} lacks the records of steps {_steps_text(gaps[0][1])}: resuming from {p} (step "
                f"{s}), the newest checkpoint before them; the later steps are computed again (the same numbers)")
        elif tried:
            log(f"[resume] resuming from {p} (step {s}), the newest complete checkpoint (skipped: {', '.join(tried)})")
        if keep != records:
            write_records(metrics, keep)
        return state
    if gaps:
        p, lost = gaps[0]
        why = f"{len(bad)} damaged lines, " if bad else ""
        raise ResumeError(f"{metrics} lacks the records of steps {_steps_text(lost)} ({why}lost or edited) and no "
                          f"checkpoint of {run_dir} comes before them, so resuming would leave them out; nothing was "
                          f"changed. Recompute the run from step 0 (deterministic: the same numbers) with: {repair}")
    if tried:
        log(f"[resume] no complete checkpoint in {run_dir / 'checkpoints'} (skipped: {', '.join(tried)}); "
            f"the run starts over from step 0")
    return None


def discard_checkpoints(run_dir: str | Path, log: Callable[[str], Any] = _stderr) -> Path | None:
    """A run started over keeps no checkpoint of an earlier attempt: ``checkpoints/`` (if any) is moved aside to
    ``checkpoints.stale-<time>`` (nothing deleted), so that a later resume cannot pick one up."""
    from interq.train.provenance import move_aside

    ckdir = Path(run_dir) / "checkpoints"
    if not ckdir.is_dir() or not any(ckdir.iterdir()):
        return None
    dest = move_aside(ckdir)
    log(f"[resume] the run starts over: checkpoints of the earlier attempt moved aside to {dest}")
    return dest
