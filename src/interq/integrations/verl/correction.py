"""InterQ's correction on a verl batch (docs/algorithm.md), replacing verl's IS weights.

verl computes rollout-correction weights on the driver, over the whole batch, in
``verl.trainer.ppo.rollout_corr_helper.compute_rollout_correction_and_add_to_batch(batch, cfg)``
(decoupled mode). When ``cfg.rollout_is`` is one of :data:`INTERQ_METHODS`, the plugin routes the call
here instead:

- ``proximal_logprobs`` = ``batch.batch["old_log_probs"]`` (the learner's no-grad pass, aligned when the
  aligned engine is on), ``behavior_logprobs`` = ``batch.batch["rollout_log_probs"]`` (the quantized
  rollout engine), action mask = ``batch.batch["response_mask"]`` (1 on assistant tokens only);
- the weights and keep-mask come from :func:`interq.algo.corrections.compute_correction`;
- verl's own code still runs with IS switched off (``rollout_is=None``) so that its rejection sampling
  (``rollout_rs``) and its off-policy metrics are exactly verl's;
- ``batch.batch["rollout_is_weights"]`` = InterQ's weights; ``batch.batch["response_mask"]`` = InterQ's
  keep-mask AND verl's rejection mask; metrics = verl's plus spec §7's under ``rollout_corr/``.

Layouts (spec §5):

- one row per trajectory (verl's agent loop): turns are the runs of 1 in ``response_mask`` (rows of interq's
  ``interq_env`` loop say so with their ``interq_turn_spans``, which equal those runs);
- one row per step (verl-agent): the non-tensor ``traj_uid`` names the trajectory and a step index names
  the turn; rows may come in any order and may be duplicated (a duplicated turn counts once).

This module imports neither verl nor Ray: it works on anything with verl's ``DataProto`` shape
(``.batch`` a mapping of tensors, ``.non_tensor_batch`` a dict of numpy arrays).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, fields
from typing import Any, Callable, Mapping

import numpy as np
import torch
from torch import Tensor

INTERQ_METHODS: tuple[str, ...] = ("interq", "interq_uniform", "prefix_is")
"""Values of ``algorithm.rollout_correction.rollout_is`` that the plugin computes with interq."""

CONFIG_PATH = "algorithm.rollout_correction"
OPTIONS_PATH = CONFIG_PATH + ".interq"
LAYOUTS = ("auto", "trajectory", "step")
METRIC_PREFIX = "rollout_corr/"
TURN_SPANS_KEY = "interq_turn_spans"
"""Field the ``interq_env`` agent loop writes: its rows are whole trajectories whose turns are the runs of 1."""


class InterqVerlError(ValueError):
    """A configuration or batch that the InterQ verl plugin cannot run on (message says what to change)."""


@dataclass(frozen=True)
class VerlInterqOptions:
    """Options read from ``+algorithm.rollout_correction.interq.*`` (all optional).

    The numeric ones are :class:`interq.algo.corrections.CorrectionConfig` fields (spec §3-§4).
    """

    budget: float = 0.5
    """InterQ displacement budget B >= 0 in nats ('inf' allowed)."""
    tis_cap: float = 2.0
    """Token TIS cap C of w_token = min(exp(delta), C)."""
    prefix_cap: float = 2.0
    """prefix_is cap on exp(sum_{k<t} D[k])."""
    token_correction: bool = True
    """Multiply by the token TIS factor (False: w_token = 1)."""
    normalize: bool | None = None
    """Divide w by its batch mean over kept tokens; None = verl's ``rollout_is_batch_normalize``."""
    layout: str = "auto"
    """``trajectory`` (one row per trajectory), ``step`` (one row per step, ``traj_key`` + ``step_key``),
    ``auto`` (``step`` when the batch carries ``traj_key``, else ``trajectory`` with a warning, once)."""
    traj_key: str = "traj_uid"
    """Field naming the trajectory of a row in the per-step layout (non-tensor or tensor)."""
    step_key: str = "step_idx"
    """Field holding the integer step (turn) index of a row in the per-step layout."""


OPTION_NAMES: tuple[str, ...] = tuple(f.name for f in fields(VerlInterqOptions))


def _plain(obj: Any) -> Any:
    """OmegaConf containers -> plain Python; anything else unchanged."""
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf
    except ImportError:  # pragma: no cover - omegaconf ships with verl
        return obj
    if isinstance(obj, (DictConfig, ListConfig)):
        return OmegaConf.to_container(obj, resolve=True)
    return obj


def _get(cfg: Any, key: str, default: Any = None) -> Any:
    if cfg is None:
        return default
    if isinstance(cfg, Mapping) or hasattr(cfg, "get"):
        try:
            return cfg.get(key, default)
        except Exception:  # omegaconf struct mode on a missing key
            return default
    return getattr(cfg, key, default)


def _number(key: str, v: Any) -> float:
    if isinstance(v, str) and v.strip().lower() in ("inf", "+inf", "infinity"):
        return math.inf
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise InterqVerlError(f"{OPTIONS_PATH}.{key} must be a number, got {v!r}")
    return float(v)


def _bool(key: str, v: Any) -> bool:
    if not isinstance(v, bool):
        raise InterqVerlError(f"{OPTIONS_PATH}.{key} must be true or false, got {v!r}")
    return v


def parse_options(rollout_corr_config: Any) -> VerlInterqOptions:
    """Read and check ``algorithm.rollout_correction.interq``; unknown keys raise :class:`InterqVerlError`."""
    raw = _plain(_get(rollout_corr_config, "interq", None))
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise InterqVerlError(
            f"{OPTIONS_PATH} must be a mapping of options (e.g. +{OPTIONS_PATH}.budget=0.5), got {raw!r}"
        )
    unknown = sorted(set(raw) - set(OPTION_NAMES))
    if unknown:
        raise InterqVerlError(
            f"unknown option(s) {', '.join(f'{OPTIONS_PATH}.{k}' for k in unknown)}; "
            f"accepted: {', '.join(OPTION_NAMES)}"
        )
    kw: dict[str, Any] = {}
    for key in ("budget", "tis_cap", "prefix_cap"):
        if key in raw:
            kw[key] = _number(key, raw[key])
    if "token_correction" in raw:
        kw["token_correction"] = _bool("token_correction", raw["token_correction"])
    if raw.get("normalize") is not None:
        kw["normalize"] = _bool("normalize", raw["normalize"])
    if "layout" in raw:
        if raw["layout"] not in LAYOUTS:
            raise InterqVerlError(f"{OPTIONS_PATH}.layout={raw['layout']!r} is not accepted; accepted: {', '.join(LAYOUTS)}")
        kw["layout"] = raw["layout"]
    for key in ("traj_key", "step_key"):
        if key in raw:
            if not isinstance(raw[key], str) or not raw[key]:
                raise InterqVerlError(f"{OPTIONS_PATH}.{key} must be a non-empty field name, got {raw[key]!r}")
            kw[key] = raw[key]
    return VerlInterqOptions(**kw)


def correction_config(opts: VerlInterqOptions, rollout_corr_config: Any = None):
    """The :class:`CorrectionConfig` of these options (``normalize`` falls back to verl's batch-normalize)."""
    from interq.algo.corrections import CorrectionConfig

    normalize = opts.normalize
    if normalize is None:
        normalize = bool(_get(rollout_corr_config, "rollout_is_batch_normalize", False))
    try:
        return CorrectionConfig(
            budget=opts.budget,
            tis_cap=opts.tis_cap,
            prefix_cap=opts.prefix_cap,
            normalize=normalize,
            token_correction=opts.token_correction,
        )
    except (TypeError, ValueError) as e:  # re-raise with the verl config path
        raise InterqVerlError(f"{OPTIONS_PATH}: {e}".replace("CorrectionConfig.", "")) from e


def check_method(rollout_corr_config: Any) -> str | None:
    """The interq method selected by ``rollout_is``, or None when verl's own levels apply.

    Raises :class:`InterqVerlError` for an interq method in bypass mode (InterQ needs the proximal
    log-probs that only decoupled mode recomputes) and for bad options.
    """
    method = _get(rollout_corr_config, "rollout_is", None)
    if method not in INTERQ_METHODS:
        return None
    if _get(rollout_corr_config, "bypass_mode", False):
        raise InterqVerlError(
            f"{CONFIG_PATH}.rollout_is={method!r} needs decoupled mode, but {CONFIG_PATH}.bypass_mode=true. "
            "Bypass mode reuses rollout_log_probs as old_log_probs, so the proximal/behavior log-ratio the "
            f"correction is built from is identically 0 and verl never calls the correction hook. Set "
            f"{CONFIG_PATH}.bypass_mode=false."
        )
    parse_options(rollout_corr_config)
    return method


# ---------------------------------------------------------------------------------------------------
# Layouts


_WARNED: set[str] = set()


def _warn_once(message: str) -> None:
    """``warnings.warn`` once per process (the hook runs on every training step)."""
    if message not in _WARNED:
        _WARNED.add(message)
        warnings.warn(message, UserWarning, stacklevel=3)


def _field(batch: Any, key: str) -> Any:
    nt = getattr(batch, "non_tensor_batch", None) or {}
    if key in nt:
        return nt[key]
    td = batch.batch
    if key in td.keys():
        return td[key]
    return None


def _has_field(batch: Any, key: str) -> bool:
    return _field(batch, key) is not None


def layout_ids(batch: Any, opts: VerlInterqOptions) -> tuple[Tensor | None, Tensor | None]:
    """(traj_id [B], turn_idx [B]) for the per-step layout, (None, None) for one row per trajectory."""
    layout = opts.layout
    if layout == "auto":
        layout = "step" if _has_field(batch, opts.traj_key) else "trajectory"
        if layout == "trajectory" and not _has_field(batch, TURN_SPANS_KEY):  # interq_env rows are trajectories
            _warn_once(
                f"interq: {OPTIONS_PATH}.layout='auto': the batch has no {opts.traj_key!r} field "
                f"({OPTIONS_PATH}.traj_key), so every row is taken as one whole trajectory. If rows are steps of "
                f"multi-turn episodes (verl-agent), each row loses its earlier turns from the prefix correction; "
                f"store the trajectory id in non_tensor_batch[{opts.traj_key!r}], or set "
                f"+{OPTIONS_PATH}.layout=trajectory to say rows are whole trajectories"
            )
    if layout == "trajectory":
        return None, None
    device = batch.batch["response_mask"].device
    B = batch.batch["response_mask"].shape[0]
    traj = _field(batch, opts.traj_key)
    step = _field(batch, opts.step_key)
    if traj is None:
        raise InterqVerlError(
            f"{OPTIONS_PATH}.layout='step' needs the trajectory of every row in the batch field "
            f"{opts.traj_key!r} ({OPTIONS_PATH}.traj_key); the batch has none"
        )
    if step is None:
        raise InterqVerlError(
            f"one row per step: the batch has {opts.traj_key!r} but no step index {opts.step_key!r}. Store each "
            f"row's integer turn index in non_tensor_batch[{opts.step_key!r}] (or name its field with "
            f"+{OPTIONS_PATH}.step_key=...), or set +{OPTIONS_PATH}.layout=trajectory if every row holds a "
            "whole trajectory"
        )
    traj_arr = traj.detach().cpu().numpy() if isinstance(traj, Tensor) else np.asarray(traj, dtype=object)
    if traj_arr.shape != (B,):
        raise InterqVerlError(f"batch field {opts.traj_key!r} must hold one value per row ({B}), got shape {traj_arr.shape}")
    _, inverse = np.unique(np.array([str(v) for v in traj_arr.tolist()], dtype=object), return_inverse=True)
    traj_id = torch.as_tensor(inverse.reshape(-1), dtype=torch.long, device=device)  # [B]
    if isinstance(step, Tensor):
        step_t = step.detach()
    else:
        step_arr = np.asarray(step)
        if step_arr.dtype == object:
            try:
                step_arr = step_arr.astype(np.int64)
            except (TypeError, ValueError):
                raise InterqVerlError(f"batch field {opts.step_key!r} must hold integer step indices, got {step_arr[:4]!r}") from None
        step_t = torch.as_tensor(step_arr)
    if step_t.shape != (B,) or step_t.is_floating_point() or step_t.dtype == torch.bool:
        raise InterqVerlError(
            f"batch field {opts.step_key!r} must be integer step indices, one per row ({B}), got dtype "
            f"{step_t.dtype} shape {tuple(step_t.shape)}"
        )
    return traj_id, step_t.to(device=device, dtype=torch.long)


# ---------------------------------------------------------------------------------------------------
# The hook


REQUIRED_FIELDS = ("old_log_probs", "rollout_log_probs", "response_mask")


def _verl_config_without_is(rollout_corr_config: Any) -> dict[str, Any]:
    """verl's settings as a plain dict with IS off: verl's own code then does RS and metrics only."""
    keys = ("rollout_is_threshold", "rollout_is_batch_normalize", "rollout_rs", "rollout_rs_threshold", "bypass_mode", "loss_type")
    d = {k: _plain(_get(rollout_corr_config, k, None)) for k in keys}
    d["rollout_is"] = None
    return d


def compute_interq_correction_and_add_to_batch(
    batch: Any,
    rollout_corr_config: Any,
    verl_fn: Callable[[Any, Any], tuple[Any, dict]],
) -> tuple[Any, dict[str, float]]:
    """verl's ``compute_rollout_correction_and_add_to_batch`` with InterQ's weights (see module doc).

    ``verl_fn`` is verl's original function; it runs with ``rollout_is=None`` for rejection sampling and
    verl's off-policy metrics.
    """
    from interq.algo.corrections import compute_correction

    method = check_method(rollout_corr_config)
    if method is None:
        raise InterqVerlError(
            f"{CONFIG_PATH}.rollout_is={_get(rollout_corr_config, 'rollout_is')!r} is not an interq method "
            f"({', '.join(INTERQ_METHODS)})"
        )
    missing = [k for k in REQUIRED_FIELDS if k not in batch.batch.keys()]
    if missing:
        hint = ""
        if "rollout_log_probs" in missing:
            hint = (" rollout_log_probs are the behavior log-probs of the rollout engine: set "
                    "actor_rollout_ref.rollout.calculate_log_probs=true.")
        if "old_log_probs" in missing:
            hint += " old_log_probs are recomputed by the actor in decoupled mode (bypass_mode=false)."
        raise InterqVerlError(f"rollout_is={method!r} needs batch fields {', '.join(missing)}, missing from the batch.{hint}")
    opts = parse_options(rollout_corr_config)
    ccfg = correction_config(opts, rollout_corr_config)

    td = batch.batch
    response_mask = td["response_mask"]  # [B, L] 0/1 (any dtype)
    proximal = td["old_log_probs"]  # [B, L]
    behavior = td["rollout_log_probs"]  # [B, L], 0.0 off the mask
    traj_id, turn_idx = layout_ids(batch, opts)  # [B] each, or None
    corr = compute_correction(
        method, proximal, behavior, response_mask.bool(), traj_id=traj_id, turn_idx=turn_idx, config=ccfg
    )

    # verl's own rejection sampling and off-policy metrics, untouched (IS off)
    batch, verl_metrics = verl_fn(batch, _verl_config_without_is(rollout_corr_config))
    rs_mask = batch.batch["response_mask"].bool()  # [B, L] verl's mask after its RS
    keep = corr.keep_mask.to(rs_mask.device) & rs_mask  # [B, L]
    weights = torch.where(keep, corr.weights.to(rs_mask.device), torch.zeros((), device=rs_mask.device))  # [B, L]
    batch.batch["response_mask"] = keep.to(response_mask.dtype)
    batch.batch["rollout_is_weights"] = weights.to(proximal.dtype)

    metrics = dict(verl_metrics)
    metrics.update({METRIC_PREFIX + k: float(v) for k, v in corr.metrics.items()})
    metrics[METRIC_PREFIX + "interq/rejected_frac"] = float(
        (corr.keep_mask.to(rs_mask.device) & ~rs_mask).sum() / max(int(response_mask.bool().sum()), 1)
    )
    return batch, metrics
