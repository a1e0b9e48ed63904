"""Atomic checkpoints: a run killed at any point resumes from its last complete checkpoint.

Layout of ``<run_dir>/checkpoints/step_000012/``: ``model.safetensors`` + ``config.json`` + tokenizer files
(a normal transformers directory, loadable with :func:`interq.train.policy.load_policy`),
``optimizer.pt``, ``rng.pt`` (python, numpy, torch), ``state.json`` (step, anything the loop needs) and
``run_config.yaml``. The folder is written under a temporary name and renamed into place, then
``checkpoints/latest`` (a one-line file) is replaced atomically; a crash leaves either the old or the new
checkpoint, never half of one.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from interq.train.config import RunConfig, save_config


def rng_state() -> dict:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def _write_text_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def save_checkpoint(run_dir: str | Path, step: int, model, tokenizer, optimizer, cfg: RunConfig,
                    state: dict[str, Any] | None = None, keep: int = 2) -> Path:
    """Write checkpoint ``step`` atomically; keep the ``keep`` most recent ones."""
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
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _write_text_atomic(ckdir / "latest", final.name + "\n")
    old = sorted(p for p in ckdir.glob("step_*") if p.is_dir() and p != final)
    for p in old[: max(0, len(old) - (keep - 1))]:
        shutil.rmtree(p, ignore_errors=True)
    return final


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    ckdir = Path(run_dir) / "checkpoints"
    pointer = ckdir / "latest"
    if pointer.is_file():
        p = ckdir / pointer.read_text().strip()
        if (p / "state.json").is_file():
            return p
    done = sorted(p for p in ckdir.glob("step_*") if (p / "state.json").is_file())
    return done[-1] if done else None


def load_checkpoint(path: str | Path, model, optimizer=None, restore_rng: bool = True) -> dict:
    """Load weights (and optimizer, RNG) from a checkpoint directory into existing objects; return state."""
    from safetensors.torch import load_file

    path = Path(path)
    weights = load_file(str(path / "model.safetensors"))
    missing, unexpected = model.load_state_dict(weights, strict=False)
    # tied embeddings are saved once; anything else missing is an error
    tied = {k for k in missing if "lm_head" in k and getattr(model.config, "tie_word_embeddings", False)}
    if set(missing) - tied or unexpected:
        raise RuntimeError(f"checkpoint {path} does not match the model: missing {sorted(set(missing) - tied)}, unexpected {unexpected}")
    if optimizer is not None and (path / "optimizer.pt").is_file():
        optimizer.load_state_dict(torch.load(path / "optimizer.pt", weights_only=False))
    if restore_rng and (path / "rng.pt").is_file():
        set_rng_state(torch.load(path / "rng.pt", weights_only=False))
    return json.loads((path / "state.json").read_text())
