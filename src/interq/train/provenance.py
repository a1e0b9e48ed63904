"""What a stored result was computed from, so that no stale result can pass for a new one.

A warm start and an RL run are reused only when they were computed from the same inputs by the same numerics:

* **warm start** (``<dir>/provenance.json``, written next to the policy): reused when its
  :data:`NUMERICS_VERSION` and the config fields it reads (:func:`warm_start_inputs`) are identical;
* **RL run** (``<run_dir>/config.yaml`` + ``<run_dir>/provenance.json``): resumed (or, finished, returned as it
  is) when its :data:`NUMERICS_VERSION`, its starting policy (:func:`policy_identity`) and its whole resolved
  config are identical, except for fields that cannot change the numbers (:data:`HARMLESS_FIELDS`) and
  ``train.steps`` going up. Extending a run is exact: the loop (:mod:`interq.train.rl`) has no schedule that
  depends on ``train.steps`` (constant learning rate; task draws, rollout seeds and mini-batch shuffles are
  functions of ``(train.seed, step)``; evaluation samples with its own seeded generators), so a run extended
  from 20 to 30 steps trains exactly as an uninterrupted 30-step run; its record keeps the extra evaluation and
  checkpoint of the old last step.

Anything else raises :class:`StaleResultError` before any work, naming the directory and every differing field
(``algo.budget: 0.5 -> 0.25``). ``fresh=True`` (``--fresh`` on the command line) moves each differing directory
aside to ``<dir>.stale-<YYYYmmdd-HHMMSS>`` (nothing is deleted; remove it when no longer needed) and starts it
again. A config field added later counts at its default for a result stored before it existed: a new field
whose default changes the numbers must come with a :data:`NUMERICS_VERSION` bump.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import yaml

from interq.train.atomic import write_text_atomic as _write_atomic
from interq.train.config import ConfigError, RunConfig, resolve_auto, to_dict

NUMERICS_VERSION = 5
"""Bump when a change alters the numbers a run produces (engine, sampling, quantization, corrections, loss,
advantages, environments, demos, tokenizer training, warm start, a config default): every warm start and run
stored under another version then refuses to be reused (``--report-only`` still reads them, saying so).

* 1: the comparison study's runs (docs/results.md; code as of commit bb485ca).
* 2: ``rollout.attention`` defaults to ``sdpa_packed``; the sampler's race is ``-log U`` with float64 uniforms
  instead of ``Tensor.exponential_`` (every sampled token changes); the aligned learner quantizes a fused input
  once (its gradients change by float rounding). It also covers d2847a6 (in the concatenated layout an action cut
  by ``rollout.max_context_tokens`` is left out of the loss), which landed during version 1 without a bump: a
  version-1 concatenated run whose episodes reached that limit may predate it.
* 3: the learner's forward over right-padded rows runs causal attention without the padding mask
  (:func:`interq.rollout.trajectory.model_attention_mask`): log-probs, ratios and corrections bit for bit the same,
  gradients changed by float rounding (torch's causal flash backward sums its blocks in another order).
* 4: the learner's defaults are ``auto``, resolved by the machine when the config is built (a run's config.yaml
  records what they resolved to): ``train.learner_autocast`` is ``bf16_backward`` (the linear layers' backward
  GEMMs in bf16, the forward fp32) on a CPU learner where bf16 is native, else ``off``; ``train.learner_attention``
  (new) is ``kernel`` (interq's causal attention, fp32, to rounding: log-probs and gradients change) on a CPU
  learner where interq's CPU kernels load, else ``sdpa``. Where both resolve to the old values (a CUDA learner,
  or no bf16 and no compiler) the numbers are version 3's. Since 2026-12-03 ``auto`` resolves
  ``train.learner_attention`` to ``sdpa`` on Intel CPUs too, and CPUs without AVX-512 keep ``sdpa`` (from
  2026-12-04 to 2026-12-06 those with AVX2 + FMA took the kernel's AVX2 tiles, slower in the study's learner): not a
  bump, since the resolved value is what a run's config records and what resume compares; a given resolved config
  computes version 4's numbers.
* 5: the learner's forward computes each distinct row of a micro-batch once, in length buckets
  (:func:`interq.train.rl.micro_batches`), and packs micro-batches by the tokens that forward computes; the
  ``study-1k`` and demo settings pack 16,384 tokens. Log-probs and losses are the same values, gradients change
  by float rounding (other GEMM shapes, another accumulation order).
"""

DEFAULT_CHANGES: dict[int, dict[str, tuple[Any, Any]]] = {2: {"rollout.attention": ("sdpa", "sdpa_packed")},
                                                          4: {"train.learner_autocast": ("off", "auto"),
                                                              "train.learner_attention": ("sdpa", "auto")}}
"""The config defaults each NUMERICS_VERSION changed: ``{version: {field: (default before, default from then)}}``.
A stored result that does not record such a field ran at the default of its own version."""

HARMLESS_FIELDS = ("train.progress", "train.tensorboard")
"""Run config fields that cannot change results (display and logging only): they may differ on resume."""

MACHINE_RESOLVED = ("train.learner_autocast", "train.learner_attention")
"""Fields whose ``auto`` each machine resolves by its CPU (:func:`interq.train.config.resolve_auto`): a run resumed
on a machine that resolves them otherwise is refused, but a report reads a run that another machine resolved, and
says so (:func:`resolved_elsewhere`)."""

PROVENANCE = "provenance.json"
_UNRECORDED = object()  # a field the stored result does not record


class StaleResultError(ConfigError):
    """An existing warm start or run directory holds results of other inputs; nothing was run. The message names
    each directory and every differing field (``old -> new``) and says how to start afresh."""


# ---------------------------------------------------------------------------------------------- identities


def files_sha256(directory: str | Path) -> str:
    """Content hash of the regular files directly in ``directory`` (names and bytes, in name order)."""
    files = sorted(p for p in Path(directory).iterdir() if p.is_file())
    return _files_sha256(tuple((str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns) for p in files))


@functools.lru_cache(maxsize=16)
def _files_sha256(files: tuple[tuple[str, int, int], ...]) -> str:  # cached while names, sizes, mtimes stay
    h = hashlib.sha256()
    for path, _, _ in files:
        h.update(Path(path).name.encode() + b"\0")
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def _plain(value: Any) -> Any:
    """The value as it reads back from JSON (tuples become lists, ...), so stored and new compare equal."""
    return json.loads(json.dumps(value))


def warm_start_inputs(cfg: RunConfig) -> dict[str, Any]:
    """The config fields :func:`interq.train.pipeline.prepare_policy` reads (dotted name -> value).

    Keep in step with ``prepare_policy`` and the builders it calls: a field read there but missing here lets a
    stale warm start be reused. Not read there: ``env.eval_split`` / ``env.num_eval_tasks`` (the held-out split
    only validates ``env.task_types``), ``env.invalid_action_penalty``, ``rollout`` except ``history_turns``,
    ``algo`` except ``layout``, ``optim``, ``train`` except ``seed`` (``train.threads`` sets speed only).
    """
    m, e = cfg.model, cfg.env
    if m.source == "tiny":  # built from the model fields, initialised with train.seed
        model = {f"model.{k}": v for k, v in to_dict(m).items()}
        model["train.seed"] = cfg.train.seed
    else:
        model = {"model.source": m.source, "model.dtype": m.dtype}
        if Path(m.source).is_dir():
            model["model.source_files_sha256"] = files_sha256(m.source)
    env = {f"env.{k}": getattr(e, k) for k in ("name", "env_kwargs", "train_split", "task_types", "num_train_tasks",
                                               "max_turns", "show_admissible", "action_format")}
    if e.prompt != "compact":  # recorded only off its default, so warm starts made before the field stay reusable
        env["env.prompt"] = e.prompt
    ws = {f"warm_start.{k}": v for k, v in to_dict(cfg.warm_start).items()
          if not (k == "tokens_per_microbatch" and v == 0 and m.source == "tiny")}  # tiny: 0 is the old numerics
    return _plain({**model, **env, **ws,
                   "algo.layout": cfg.algo.layout, "rollout.history_turns": cfg.rollout.history_turns})


def warm_start_identity(cfg: RunConfig) -> dict:
    """What a warm start made from ``cfg`` by this code is: numerics version and inputs."""
    return {"numerics_version": NUMERICS_VERSION, "inputs": warm_start_inputs(cfg)}


def policy_identity(policy_dir: str | Path) -> dict:
    """What a starting policy directory is: an interq warm start's recorded identity, else a content hash."""
    if not Path(policy_dir).is_dir():
        raise ConfigError(f"policy directory {str(policy_dir)!r} does not exist")
    prov = _read_json(Path(policy_dir) / PROVENANCE)
    if prov and prov.get("kind") == "warm_start":
        return {"numerics_version": prov.get("numerics_version"), "inputs": prov.get("inputs")}
    return {"files_sha256": files_sha256(policy_dir)}


# ---------------------------------------------------------------------------------------------- comparisons


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _flatten(d: dict, prefix: str = "", depth: int = 2) -> dict[str, Any]:
    """Dotted names down to ``depth`` levels (config: ``section.field``; a dict-valued field stays one value)."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        name = f"{prefix}{k}"
        if isinstance(v, dict) and depth > 1 and v:
            out.update(_flatten(v, name + ".", depth - 1))
        else:
            out[name] = v
    return out


def _show(v: Any) -> str:
    if v is _UNRECORDED:
        return "<unrecorded>"
    if isinstance(v, str):
        return v if v else "''"
    return json.dumps(v, sort_keys=True)


def _change(name: str, old: Any, new: Any) -> str:
    return f"{name}: {_show(old)} -> {_show(new)}"


def _diff(old: dict[str, Any], new: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    keys = list(new) + [k for k in old if k not in new]
    return [(k, old.get(k, _UNRECORDED), new.get(k, _UNRECORDED)) for k in keys
            if old.get(k, _UNRECORDED) != new.get(k, _UNRECORDED)]


def _resolved(cfg_dict: dict) -> dict:
    """A config dict as stored in config.yaml and read back (floats, inf, lists normalised alike)."""
    return yaml.safe_load(yaml.safe_dump(cfg_dict, sort_keys=False))


def _defaults_of(version: Any) -> dict[str, Any]:
    """The flattened config defaults under numerics ``version`` (the current ones with later changes undone; an
    unrecorded version counts as older than every change)."""
    defaults = _flatten(_resolved(to_dict(resolve_auto(RunConfig()))))  # auto as this machine resolves it
    version = version if isinstance(version, int) else 0
    for v in sorted(DEFAULT_CHANGES, reverse=True):
        if v > version:
            defaults.update({name: before for name, (before, _) in DEFAULT_CHANGES[v].items()})
    return defaults


def older_version(version: Any) -> bool:
    """A recorded numerics version older than this code's (report mode reads such results; not newer, unrecorded)."""
    return isinstance(version, int) and version < NUMERICS_VERSION


def _moved(name: str, old: Any, new: Any, version: Any) -> bool:
    """``old`` -> ``new`` is a result of an older ``version`` at that version's default against today's default,
    the default of ``name`` having moved since (:data:`DEFAULT_CHANGES`)."""
    if not older_version(version) or not any(name in ch for v, ch in DEFAULT_CHANGES.items() if v > version):
        return False
    return old == _defaults_of(version)[name] and new == _defaults_of(NUMERICS_VERSION)[name]


def _stored_and_here(cfg: RunConfig, run_dir: str | Path) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The run's stored config.yaml and ``cfg``, both flattened (``None``: no readable config.yaml)."""
    try:
        stored = yaml.safe_load((Path(run_dir) / "config.yaml").read_text())
    except (OSError, yaml.YAMLError):
        return None
    return _flatten(stored if isinstance(stored, dict) else {}), _flatten(_resolved(to_dict(cfg)))


def moved_defaults(cfg: RunConfig, run_dir: str | Path) -> list[str]:
    """The fields a report reads across for the run in ``run_dir`` (of an older numerics version): it ran at its
    version's default, ``cfg`` is at today's, that default having moved since. ``name: old -> new`` each."""
    version = stored_numerics_version(run_dir)
    both = _stored_and_here(cfg, run_dir)
    if both is None:
        return []
    old = {**_defaults_of(version), **both[0]}
    return [_change(k, o, n) for k, o, n in _diff(old, both[1]) if _moved(k, o, n, version)]


def resolved_elsewhere(cfg: RunConfig, run_dir: str | Path) -> list[tuple[str, Any, Any]]:
    """The :data:`MACHINE_RESOLVED` fields a report reads across for the run in ``run_dir``: the run has another
    value than ``cfg`` resolves to here (another CPU class resolved ``auto``). ``(name, stored, here)`` each."""
    both = _stored_and_here(cfg, run_dir)
    if both is None:
        return []
    old, new = both
    return [(k, old[k], new[k]) for k in MACHINE_RESOLVED if k in old and old[k] != new[k]]


def stored_numerics_version(result_dir: str | Path) -> Any:
    """The NUMERICS_VERSION a stored warm start or run directory was computed under (``None``: unrecorded)."""
    return (_read_json(Path(result_dir) / PROVENANCE) or {}).get("numerics_version")


def warm_start_differences(cfg: RunConfig, out_dir: str | Path, report: bool = False) -> list[str]:
    """Why the warm start in ``out_dir`` cannot serve ``cfg`` (empty: absent, empty, or reusable). ``report``: only
    what makes it another warm start than ``cfg``'s, not an older numerics version it was computed under."""
    out_dir = Path(out_dir)
    if not out_dir.is_dir() or not any(out_dir.iterdir()):
        return []
    if not (out_dir / "policy_summary.json").is_file():
        return ["contents: not a warm start (no policy_summary.json)"]
    stored = _read_json(out_dir / PROVENANCE) or {}
    new = warm_start_identity(cfg)
    out = []
    version = stored.get("numerics_version", _UNRECORDED)
    if version != NUMERICS_VERSION and not (report and older_version(version)):
        out.append(_change("numerics_version", version, NUMERICS_VERSION))
    if "inputs" in stored:
        out += [_change(k, o, n) for k, o, n in _diff(stored["inputs"], new["inputs"])]
    return out


def _holds_run(run_dir: Path) -> bool:
    return any((run_dir / n).exists() for n in ("config.yaml", PROVENANCE, "metrics.jsonl", "checkpoints"))


def run_differences(cfg: RunConfig, run_dir: str | Path, start_policy: dict | None, report: bool = False) -> list[str]:
    """Why the run in ``run_dir`` cannot be resumed as ``cfg`` from ``start_policy`` (empty: none there, or it can).

    ``report``: why its records are not those of ``cfg``'s run, for reading them without running anything: a run
    of an older numerics version passes (the caller says so), and so does a field where the run had its version's
    default and ``cfg`` has today's, that default having moved since (:data:`DEFAULT_CHANGES`;
    :func:`moved_defaults` lists them). A newer or unrecorded version is still a difference."""
    run_dir = Path(run_dir)
    if not _holds_run(run_dir):
        return []
    try:
        stored_cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    except (OSError, yaml.YAMLError):
        stored_cfg = None
    if not isinstance(stored_cfg, dict):
        return ["config.yaml: <unrecorded>"]
    prov = _read_json(run_dir / PROVENANCE) or {}
    version = prov.get("numerics_version", _UNRECORDED)
    out, changed = [], []
    if version != NUMERICS_VERSION:
        changed.append("numerics_version")
        if not (report and older_version(version)):
            out.append(_change("numerics_version", version, NUMERICS_VERSION))
    # a field added since counts at the default of the run's version (see module docstring)
    old = {**_defaults_of(version), **_flatten(stored_cfg)}
    new = _flatten(_resolved(to_dict(cfg)))
    for name, o, n in _diff(old, new):
        if name in HARMLESS_FIELDS or (report and (_moved(name, o, n, version) or name in MACHINE_RESOLVED)):
            continue
        if name == "train.steps" and isinstance(o, int) and isinstance(n, int) and n > o:
            continue  # extending a run is exact (module docstring)
        changed.append(name)
        out.append(_change(name, o, n) + (" (a run can be extended, not shortened)" if name == "train.steps" else ""))
    old_start = prov.get("start_policy", _UNRECORDED)
    new_start = _plain(start_policy)
    if old_start != new_start:
        if isinstance(old_start, dict) and isinstance(new_start, dict):
            parts = _diff(_flatten(old_start, depth=2), _flatten(new_start, depth=2))
            # what is already listed above (a config field, the numerics version) is not repeated
            out += [_change(f"start_policy.{k}", o, n) for k, o, n in parts
                    if k.removeprefix("inputs.") not in changed]
        else:
            out.append(_change("start_policy", old_start, new_start))
    return out


# ---------------------------------------------------------------------------------------------- records


def write_warm_start_provenance(cfg: RunConfig, out_dir: str | Path) -> None:
    rec = {"kind": "warm_start", **warm_start_identity(cfg)}
    _write_atomic(Path(out_dir) / PROVENANCE, json.dumps(rec, indent=1) + "\n")


def write_run_record(cfg: RunConfig, run_dir: str | Path, start_policy: dict | None) -> None:
    """``config.yaml`` (the resolved config the run now runs under) and ``provenance.json``; call only after
    :func:`run_differences` found nothing."""
    run_dir = Path(run_dir)
    rec = {"kind": "rl_run", "numerics_version": NUMERICS_VERSION, "start_policy": _plain(start_policy)}
    _write_atomic(run_dir / PROVENANCE, json.dumps(rec, indent=1) + "\n")
    _write_atomic(run_dir / "config.yaml", yaml.safe_dump(to_dict(cfg), sort_keys=False))


# ---------------------------------------------------------------------------------------------- refusing / starting afresh


def stale_message(stale: Iterable[tuple[Path, list[str]]]) -> str:
    """One line: every stale directory with its differing fields, and what to do."""
    parts = [f"{p} holds results of other inputs ({', '.join(d)})" for p, d in stale]
    return ("; ".join(parts) + "; nothing was run. Pass --fresh to move them aside to <dir>.stale-<time> and "
            "start them again, or use another --out")


def move_aside(path: str | Path, keep: Iterable[str] = ()) -> Path:
    """Rename ``path`` to ``<path>.stale-<YYYYmmdd-HHMMSS>``; children named in ``keep`` stay where they are."""
    path = Path(path)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    dest, k = path.with_name(f"{path.name}.stale-{stamp}"), 1
    while dest.exists():
        k += 1
        dest = path.with_name(f"{path.name}.stale-{stamp}-{k}")
    keep = set(keep)
    if not any((path / n).exists() for n in keep):
        os.replace(path, dest)
        return dest
    dest.mkdir()
    for child in path.iterdir():
        if child.name not in keep:
            os.replace(child, dest / child.name)
    return dest


def settle(checks: list[tuple[Path, list[str]]], fresh: bool, log: Callable[[str], Any] = print) -> None:
    """Given (directory, differences) for everything a command will reuse: raise :class:`StaleResultError` naming
    every stale one, or with ``fresh`` move each stale one aside (a reusable directory inside it stays)."""
    stale = [(Path(p), d) for p, d in checks if d]
    if not stale:
        return
    if not fresh:
        raise StaleResultError(stale_message(stale))
    clean = [Path(p).resolve() for p, d in checks if not d]
    for path, _ in sorted(stale, key=lambda s: len(s[0].resolve().parts)):  # outer first: an inner one moves with it
        if path.exists():
            dest = move_aside(path, keep=[c.name for c in clean if c.parent == path.resolve()])
            log(f"[fresh] {path}: results of other inputs moved aside to {dest}")
