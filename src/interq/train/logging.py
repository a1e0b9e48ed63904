"""Run logging: one JSONL line per step (spec §7 metric names), a progress bar, optional TensorBoard."""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from interq.train.atomic import fsync_path as _fsync_dir


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _clean(v):
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return v


class RunLogger:
    """Appends step records to ``<run_dir>/metrics.jsonl``; each line is flushed and fsync'ed."""

    def __init__(self, run_dir: str | Path, *, progress_total: int | None = None, progress: bool = True,
                 tensorboard: bool = False, desc: str = "rl", start: int = 0) -> None:
        self.path = Path(run_dir) / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._bar = None
        if progress and progress_total:
            from tqdm import tqdm

            self._bar = tqdm(total=progress_total, initial=start, desc=desc, file=sys.stderr, dynamic_ncols=True,
                             leave=False)
        self._tb = None
        if tensorboard:
            from interq._optional import require

            tb = require("torch.utils.tensorboard", "tensorboard")
            self._tb = tb.SummaryWriter(str(Path(run_dir) / "tensorboard"))

    def truncate_after(self, step: int, log: Callable[[str], Any] | None = None) -> list[dict]:
        """Keep the records of steps ``<= step`` (a resumed run logs the later ones again; ``step < 0``: none, a run
        started over keeps no record of an earlier attempt); return them.

        A torn last line (half-written at a crash) is dropped and said with ``log`` (default: stderr); a step
        recorded twice keeps its last record (the attempt the checkpoint came from). The file is rewritten only
        if something changes, atomically (temporary file fsynced, renamed, directory fsynced)."""
        say = log or _stderr
        if not self.path.is_file():
            return []
        records, torn = scan_jsonl(self.path)  # a damaged line anywhere: dropped and said (resume_run checked the rest)
        kept = [r for r in records if step >= 0 and isinstance(r.get("step"), int) and r["step"] <= step]
        last = {r["step"]: r for r in kept}
        keep = [last[s] for s in sorted(last)]
        if torn:
            say(f"[resume] {self.path}: {'; '.join(torn[:3])}{'; ...' if len(torn) > 3 else ''}; dropped")
        if len(keep) < len(kept):
            say(f"[resume] {self.path}: {len(kept) - len(keep)} earlier records of a step recorded twice dropped "
                f"(each step keeps its last record)")
        size = self.path.stat().st_size
        with open(self.path, "rb") as f:  # a last line without its newline: the next record must not join it
            f.seek(max(0, size - 1))
            ends_open = size > 0 and f.read(1) != b"\n"
        if keep == records and not torn and not ends_open:
            return keep
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        with open(tmp, "w") as f:
            f.write("".join(json.dumps(r) + "\n" for r in keep))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        _fsync_dir(self.path.parent)
        return keep

    def log(self, record: dict) -> None:
        line = json.dumps({k: _clean(v) for k, v in record.items()}, sort_keys=False)
        with open(self.path, "a") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())
        if self._tb is not None:
            step = int(record.get("step", 0))
            for k, v in record.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    self._tb.add_scalar(k, v, step)
        if self._bar is not None:
            post = {k.split("/")[-1]: f"{record[k]:.3g}" for k in ("rollout/success", "eval/success", "loss/policy")
                    if isinstance(record.get(k), (int, float))}
            self._bar.set_postfix(post, refresh=False)
            step = record.get("step")  # the bar counts training steps: the step-0 evaluation is not one
            self._bar.update(max(0, step - self._bar.n) if isinstance(step, int) else 1)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        if self._tb is not None:
            self._tb.close()


def write_records(path: str | Path, records: list[dict]) -> None:
    """Replace a JSONL file by ``records``, atomically (temporary file fsynced, renamed, directory fsynced)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        f.write("".join(json.dumps(r) + "\n" for r in records))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def scan_jsonl(path: str | Path) -> tuple[list[dict], list[str]]:
    """Every readable record of a JSONL file, and a description of each line that is not one (any line: torn at a
    crash, edited by hand); ``([], [])`` where there is no file."""
    p = Path(path)
    if not p.is_file():
        return [], []
    out, bad = [], []
    lines = p.read_text(errors="replace").split("\n")
    filled = [i for i, ln in enumerate(lines) if ln.strip()]
    for i in filled:
        ln = lines[i]
        try:
            rec = json.loads(ln)
            if not isinstance(rec, dict):
                raise ValueError(f"a JSON {type(rec).__name__}, not an object")
        except ValueError:
            bad.append(f"torn last line {i + 1} ({len(ln)} characters, not a JSON record)" if i == filled[-1]
                       else f"line {i + 1} ({len(ln)} characters) is not a JSON record")
            continue
        out.append(rec)
    return out, bad


def read_jsonl(path: str | Path, on_torn: Callable[[str], Any] | None = None) -> list[dict]:
    """The records of a JSONL file ([] if there is none). A last line that is not a JSON object (half-written at a
    crash, or still being written by a running process) is left out and described to ``on_torn``; any other
    unreadable line raises ``ValueError`` with the file and line number."""
    p = Path(path)
    if not p.is_file():
        return []
    lines = p.read_text(errors="replace").split("\n")
    filled = [i for i, ln in enumerate(lines) if ln.strip()]
    out = []
    for i in filled:
        try:
            rec = json.loads(lines[i])
            if not isinstance(rec, dict):
                raise ValueError(f"a JSON {type(rec).__name__}, not an object")
        except ValueError as e:
            if i != filled[-1]:
                raise ValueError(f"{p}: line {i + 1} is not a JSON record ({e}); the log is damaged before its "
                                 f"last line") from None
            if on_torn is not None:
                on_torn(f"torn last line {i + 1} ({len(lines[i])} characters, not a JSON record)")
            break
        out.append(rec)
    return out
