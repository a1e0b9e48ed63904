"""Run logging: one JSONL line per step (spec §7 metric names), a progress bar, optional TensorBoard."""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path


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

    def truncate_after(self, step: int) -> None:
        """Drop lines logged after ``step`` (a resumed run rewrites them); atomic rewrite."""
        if not self.path.is_file():
            return
        keep = [ln for ln in self.path.read_text().splitlines() if ln.strip() and json.loads(ln).get("step", -1) <= step]
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text("".join(ln + "\n" for ln in keep))
        os.replace(tmp, self.path)

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
            self._bar.update(1)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        if self._tb is not None:
            self._tb.close()


def read_jsonl(path: str | Path) -> list[dict]:
    p = Path(path)
    if not p.is_file():
        return []
    return [json.loads(ln) for ln in p.read_text().splitlines() if ln.strip()]
