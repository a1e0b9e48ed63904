"""Durable file writes shared by checkpoints, the metrics log and run records: fsync, then rename into place."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def fsync_path(path: Path) -> None:
    """fsync a file, or a directory (its entries: renames into it); directories are skipped on Windows."""
    path = Path(path)
    if path.is_dir() and os.name == "nt":
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_text_atomic(path: Path, text: str) -> None:
    """Replace ``path`` with ``text``: a temporary file beside it, fsynced, renamed over it, directory fsynced."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_path(path.parent)
