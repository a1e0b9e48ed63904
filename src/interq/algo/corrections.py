"""Off-policy corrections for quantized rollouts: InterQ and its baselines (docs/algorithm.md).

Public, stable entry points:

- ``compute_correction(method, proximal_logprobs, behavior_logprobs, action_mask, *, traj_id=None,
  turn_idx=None, config=CorrectionConfig()) -> Correction``
- ``interq_prefix_logweights(proximal_logprobs, behavior_logprobs, action_mask, budget, *, traj_id=None,
  turn_idx=None, uniform_support=False) -> Tensor``  (Lambda of §3 per token, 0 off action tokens)
- ``interq_turn_profile(proximal_logprobs, behavior_logprobs, action_mask, budget, *, traj_id=None,
  turn_idx=None, uniform_support=False) -> dict[str, float]``  (the diagnostic per-turn curves of
  ``interq mismatch``: signed delta, budget binding, effective support and counts per turn number)

Inputs
------
``proximal_logprobs``, ``behavior_logprobs``: [B, L] floating tensors (log-probs of the same sampled
tokens under pi_old and the executor mu).  ``action_mask``: [B, L] bool, True on generated action tokens.

Layouts (§5):

- *Concatenated* (``traj_id`` and ``turn_idx`` both None): one row per trajectory; its segments
  (turns) are the maximal runs of True in the row's mask, in order.
- *Per-turn* (``traj_id`` and ``turn_idx`` both given, integer tensors [B]): one row per
  (trajectory, turn); all action tokens of a row form one segment; a turn's history is every row with
  the same ``traj_id`` and a smaller ``turn_idx`` (values need not be contiguous or start at 0).  The
  result does not depend on row order.  Rows with no action token are padding.  Rows repeating the
  same ``(traj_id, turn_idx)`` are duplicates of one turn: the turn counts once in every history (its
  statistics are the mean over its copies, exact for identical copies) and all copies get the same
  prefix weight ``Lambda``; their token factors come from their own tokens (identical for copies).
  For the sequence-level methods (``seq_is``, ``geo_mask``) a trajectory is the set of rows with the
  same ``traj_id`` (each distinct turn counted once).

Outputs
-------
``Correction.weights`` [B, L] float32 is the per-token loss weight ``w`` on kept tokens and 0 wherever
``keep_mask`` is False.  ``Correction.keep_mask`` [B, L] bool is a subset of ``action_mask``: action
tokens with finite log-probs that the method keeps.  The loss multiplies by ``weights`` and averages
over ``keep_mask`` (``interq.algo.loss``).  Non-finite log-probs on an action token (§2) drop it from
every sum and from the loss and are counted in ``mismatch/nonfinite_frac``; nothing raises.
``Correction.lambda_`` [B, L] float32 is the prefix log-weight on action tokens for ``interq`` and
``interq_uniform`` (Lambda of §3) and ``prefix_is`` (log min(exp(sum_{k<t} D[k]), C_prefix)); None for the
other methods.  ``Correction.metrics`` holds every §7 metric (names and the flat per-turn key format
``turn/<curve>/<t>`` are documented in ``interq.algo.metrics``); ``interq/*`` only for ``interq`` and
``interq_uniform``, ``turn/abs_Lambda/<t>`` for those and ``prefix_is``, ``geo/traj_keep_frac`` for
``geo_mask``.

Everything is computed without grad in float64 and returned as float32.  No Python loop runs over
tokens, segments or rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum
from typing import Callable

import torch
from torch import Tensor

from interq.algo import metrics as M
from interq.algo._segments import Structure, build_structure

DELTA_CLAMP = 20.0  # §2: delta = clamp(proximal - behavior, -20, 20)


class CorrectionMethod(str, Enum):
    """Registry keys of the corrections (§3, §4)."""

    NONE = "none"
    TIS = "tis"
    ICEPOP = "icepop"
    SEQ_IS = "seq_is"
    GEO_MASK = "geo_mask"
    PREFIX_IS = "prefix_is"
    INTERQ = "interq"
    INTERQ_UNIFORM = "interq_uniform"


METHODS: tuple[str, ...] = tuple(m.value for m in CorrectionMethod)


@dataclass(frozen=True)
class CorrectionConfig:
    """Hyper-parameters of the corrections (docs/algorithm.md)."""

    budget: float = 0.5
    """InterQ displacement budget B >= 0 in nats (may be inf)."""
    tis_cap: float = 2.0
    """Token TIS cap C > 0: w_token = min(exp(delta), C)."""
    icepop_bounds: tuple[float, float] = (0.5, 2.0)
    """icepop keeps a token iff lo <= exp(delta) <= hi."""
    geo_bounds: tuple[float, float] = (0.9, 1.1)
    """geo_mask keeps a trajectory iff lo <= exp(mean delta) <= hi."""
    prefix_cap: float = 2.0
    """prefix_is cap C_prefix > 0 on exp(sum_{k<t} D[k])."""
    normalize: bool = False
    """Divide w by its mean over the batch's kept action tokens."""
    token_correction: bool = True
    """w_token = min(exp(delta), C) when True, 1 when False (interq, interq_uniform, prefix_is, geo_mask)."""

    def __post_init__(self) -> None:
        def num(name: str, v: object) -> float:
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise TypeError(f"CorrectionConfig.{name} must be a number, got {type(v).__name__} {v!r}")
            if math.isnan(v):
                raise ValueError(f"CorrectionConfig.{name} must not be NaN")
            return float(v)

        b = num("budget", self.budget)
        if b < 0:
            raise ValueError(f"CorrectionConfig.budget must be >= 0 (nats, inf allowed), got {b}")
        for name in ("tis_cap", "prefix_cap"):
            v = num(name, getattr(self, name))
            if not v > 0:
                raise ValueError(f"CorrectionConfig.{name} must be > 0, got {v}")
        for name in ("icepop_bounds", "geo_bounds"):
            v = getattr(self, name)
            if not isinstance(v, (tuple, list)) or len(v) != 2:
                raise TypeError(f"CorrectionConfig.{name} must be a pair (lo, hi), got {v!r}")
            lo, hi = num(f"{name}[0]", v[0]), num(f"{name}[1]", v[1])
            if not 0 <= lo <= hi:
                raise ValueError(f"CorrectionConfig.{name} must satisfy 0 <= lo <= hi, got ({lo}, {hi})")
            object.__setattr__(self, name, (lo, hi))
        for name in ("normalize", "token_correction"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"CorrectionConfig.{name} must be a bool, got {getattr(self, name)!r}")


@dataclass
class Correction:
    """Result of ``compute_correction`` (see the module docstring for the contract)."""

    weights: Tensor  # [B, L] float32, 0 where keep_mask is False
    keep_mask: Tensor  # [B, L] bool, subset of action_mask
    metrics: dict[str, float] = field(default_factory=dict)
    lambda_: Tensor | None = None  # [B, L] float32 prefix log-weight on action tokens (interq*, prefix_is), else None


# ---------------------------------------------------------------------------------------------------
# Validation


def _check_logprobs(name: str, x: object) -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor [B, L] of floats, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating tensor, got dtype {x.dtype}")
    if x.dim() != 2:
        raise ValueError(f"{name} must have shape [B, L], got {tuple(x.shape)}")
    return x


def _validate(proximal: object, behavior: object, action_mask: object, traj_id: object, turn_idx: object):
    p = _check_logprobs("proximal_logprobs", proximal)
    b = _check_logprobs("behavior_logprobs", behavior)
    if b.shape != p.shape:
        raise ValueError(f"behavior_logprobs shape {tuple(b.shape)} does not match proximal_logprobs shape {tuple(p.shape)}")
    if not isinstance(action_mask, Tensor):
        raise TypeError(f"action_mask must be a torch.Tensor [B, L] of dtype bool, got {type(action_mask).__name__}")
    if action_mask.dtype != torch.bool:
        raise TypeError(f"action_mask must have dtype torch.bool, got {action_mask.dtype} (use mask.bool() if it is 0/1)")
    if action_mask.shape != p.shape:
        raise ValueError(f"action_mask shape {tuple(action_mask.shape)} does not match proximal_logprobs shape {tuple(p.shape)}")
    if (traj_id is None) != (turn_idx is None):
        raise ValueError("traj_id and turn_idx must be given together (per-turn layout) or both left None (concatenated layout)")
    if traj_id is not None:
        for name, v in (("traj_id", traj_id), ("turn_idx", turn_idx)):
            if not isinstance(v, Tensor):
                raise TypeError(
                    f"{name} must be an integer torch.Tensor [B], got {type(v).__name__} "
                    "(string or other labels: interq.algo.advantages.group_index(labels)[0] maps them to ints)"
                )
            if v.dtype == torch.bool or v.is_floating_point() or v.is_complex():
                raise TypeError(f"{name} must have an integer dtype, got {v.dtype}")
            if v.shape != (p.shape[0],):
                raise ValueError(f"{name} must have shape [B] = ({p.shape[0]},), got {tuple(v.shape)}")
        traj_id = traj_id.to(device=p.device, dtype=torch.long)
        turn_idx = turn_idx.to(device=p.device, dtype=torch.long)
    return p, b, action_mask.to(p.device), traj_id, turn_idx


def _method(method: object) -> CorrectionMethod:
    try:
        return CorrectionMethod(method)
    except ValueError:
        raise ValueError(f"unknown correction method={method!r}; accepted: {', '.join(METHODS)}") from None


# ---------------------------------------------------------------------------------------------------
# Shared quantities (§2)


@dataclass
class _Batch:
    """Token and turn quantities shared by all methods (all float64, detached)."""

    st: Structure
    delta_raw: Tensor  # [B, L] proximal - behavior, 0 where not valid
    delta: Tensor  # [B, L] clamped to [-20, 20], 0 where not valid
    valid: Tensor  # [B, L] bool, action token with finite log-probs
    seg_D: Tensor  # [S] sum of delta over the segment's valid tokens
    seg_n: Tensor  # [S] number of valid tokens
    seg_abs: Tensor  # [S] sum of |delta|
    idx_flat: Tensor  # [B*L] segment id of each valid token, S (dummy bucket) for every other token
    _support: Tensor | None = None
    _rho: Tensor | None = None

    def rho(self) -> Tensor:
        """Token ratio exp(delta) (clamped delta; 1 where not valid).  [B, L]"""
        if self._rho is None:
            self._rho = torch.exp(self.delta)  # [B, L]
        return self._rho

    def seg_sum(self, token_values: Tensor) -> Tensor:
        """Sum of a token quantity (0 where not valid) over each segment.  [B, L] -> [S]"""
        S = self.st.num_segments
        sums = torch.bincount(self.idx_flat, weights=token_values.reshape(-1).to(torch.float64), minlength=S + 1)  # [S + 1]
        return sums[:S]  # [S], the dummy bucket S collects every other token

    def support(self) -> Tensor:
        """Effective support s of every segment (§2), 1 for segments without a valid token.  [S]"""
        if self._support is None:
            S = self.st.num_segments
            d = self.delta.reshape(-1)  # [B*L]
            mx = torch.full((S + 1,), -math.inf, dtype=d.dtype, device=d.device)  # [S + 1]
            mx.scatter_reduce_(0, self.idx_flat, d, reduce="amax", include_self=True)
            r = torch.exp(d - mx[self.idx_flat]).reshape(self.delta.shape)  # [B, L], in (0, 1] on valid tokens
            r = torch.where(self.valid, r, 0.0)  # [B, L]
            sr = self.seg_sum(r)  # [S]
            sr2 = self.seg_sum(r * r)  # [S]
            s = sr * sr / (self.seg_n * sr2).clamp(min=1e-300)  # [S]
            self._support = torch.where(self.seg_n > 0, s.clamp(max=1.0), torch.ones_like(s))  # [S]
        return self._support


def _prepare(proximal: Tensor, behavior: Tensor, action_mask: Tensor, traj_id: Tensor | None, turn_idx: Tensor | None) -> _Batch:
    p = proximal.detach().to(torch.float64)  # [B, L]
    b = behavior.detach().to(torch.float64)  # [B, L]
    diff = p - b  # [B, L], finite iff both log-probs are finite (float64 cannot overflow here)
    valid = action_mask & torch.isfinite(diff)  # [B, L]
    delta_raw = torch.where(valid, diff, 0.0)  # [B, L]
    delta = delta_raw.clamp(-DELTA_CLAMP, DELTA_CLAMP)  # [B, L]
    st = build_structure(action_mask, traj_id, turn_idx)
    S = st.num_segments
    idx_flat = torch.where(valid, st.seg_of_token, S).reshape(-1)  # [B*L]
    empty = p.new_zeros(0)
    bt = _Batch(st, delta_raw, delta, valid, empty, empty, empty, idx_flat)
    bt.seg_D = bt.seg_sum(delta)  # [S]
    bt.seg_n = bt.seg_sum(valid.to(torch.float64))  # [S]
    bt.seg_abs = bt.seg_sum(delta.abs())  # [S]
    return bt


def _tis_factor(bt: _Batch, cfg: CorrectionConfig) -> Tensor:
    """Token TIS factor min(exp(delta), C) (§3, §4 ``tis``).  [B, L]"""
    return bt.rho().clamp(max=cfg.tis_cap)  # [B, L]


def _w_token(bt: _Batch, cfg: CorrectionConfig) -> Tensor | float:
    """w_token of §3: the TIS factor, or 1 when the token correction is switched off.  [B, L]"""
    return _tis_factor(bt, cfg) if cfg.token_correction else 1.0


@dataclass
class _PrefixParts:
    Lambda: Tensor  # [U] prefix log-weight of every turn
    kappa: Tensor  # [U]
    support: Tensor  # [U]
    raw_prefix: Tensor  # [U] sum_{k<t} D[k]


def _interq_turns(bt: _Batch, budget: float, uniform_support: bool) -> _PrefixParts:
    """§3 on the distinct turns: demand, kappa, Lambda.  All [U]."""
    st = bt.st
    s_seg = torch.ones_like(bt.seg_D) if uniform_support else bt.support()  # [S]
    s = st.seg_to_unit_mean(s_seg)  # [U]
    a = st.seg_to_unit_mean(s_seg * bt.seg_D.abs())  # [U] s[k] |D[k]|
    c = st.seg_to_unit_mean(s_seg * bt.seg_D)  # [U] s[k] D[k]
    demand = st.history_sum(a).clamp(min=0.0)  # [U] sum_{k<t} s|D|
    numer = st.history_sum(c)  # [U] sum_{k<t} s D
    B = float(budget)
    kappa = torch.where(demand <= B, torch.ones_like(demand), B / demand.clamp(min=1e-300))  # [U]
    Lambda = (kappa * numer).clamp(-B, B)  # [U], |Lambda| <= B (the clamp only absorbs rounding)
    raw = st.history_sum(st.seg_to_unit_mean(bt.seg_D))  # [U]
    return _PrefixParts(Lambda, kappa, s, raw)


# ---------------------------------------------------------------------------------------------------
# Methods: one function each -> (weights [B, L], keep [B, L], Lambda per turn [U] | None, extra metrics)

_Out = tuple[Tensor, Tensor, "Tensor | None", dict]


def _none(bt: _Batch, cfg: CorrectionConfig) -> _Out:
    return torch.ones_like(bt.delta), bt.valid, None, {}


def _tis(bt: _Batch, cfg: CorrectionConfig) -> _Out:
    return _tis_factor(bt, cfg), bt.valid, None, {}


def _icepop(bt: _Batch, cfg: CorrectionConfig) -> _Out:
    lo, hi = cfg.icepop_bounds
    rho = bt.rho()  # [B, L]
    keep = bt.valid & (rho >= lo) & (rho <= hi)  # [B, L]
    return rho, keep, None, {}


def _traj_of_tokens(bt: _Batch, traj_values: Tensor) -> Tensor:
    """Broadcast a per-trajectory value to the action tokens of the trajectory.  [num_trajs] -> [B, L]"""
    return bt.st.unit_to_tokens(traj_values[bt.st.unit_traj])


def _seq_is(bt: _Batch, cfg: CorrectionConfig) -> _Out:
    st = bt.st
    traj_D = st.traj_sum(st.seg_to_unit_mean(bt.seg_D))  # [num_trajs]
    w_traj = torch.exp(traj_D.clamp(max=700.0)).clamp(max=cfg.tis_cap)  # [num_trajs]
    return _traj_of_tokens(bt, w_traj), bt.valid, None, {}


def _geo_mask(bt: _Batch, cfg: CorrectionConfig) -> _Out:
    st = bt.st
    lo, hi = cfg.geo_bounds
    traj_D = st.traj_sum(st.seg_to_unit_mean(bt.seg_D))  # [num_trajs]
    traj_n = st.traj_sum(st.seg_to_unit_mean(bt.seg_n))  # [num_trajs]
    geo = torch.exp(traj_D / traj_n.clamp(min=1.0))  # [num_trajs] exp(mean delta)
    keep_traj = (geo >= lo) & (geo <= hi)  # [num_trajs]
    keep = bt.valid & _traj_of_tokens(bt, keep_traj.to(torch.float64)).bool()  # [B, L]
    return _w_token(bt, cfg) * torch.ones_like(bt.delta), keep, None, {"geo/traj_keep_frac": float(keep_traj[traj_n > 0].double().mean()) if bool((traj_n > 0).any()) else 0.0}


def _prefix_is(bt: _Batch, cfg: CorrectionConfig) -> _Out:
    st = bt.st
    raw = st.history_sum(st.seg_to_unit_mean(bt.seg_D))  # [U] sum_{k<t} D[k]
    log_w = raw.clamp(max=math.log(cfg.prefix_cap))  # [U] log min(exp(P), C_prefix)
    w_prefix = st.unit_to_tokens(torch.exp(log_w))  # [B, L]
    return w_prefix * _w_token(bt, cfg), bt.valid, log_w, {}


def _interq_common(bt: _Batch, cfg: CorrectionConfig, uniform: bool) -> _Out:
    parts = _interq_turns(bt, cfg.budget, uniform)
    w_prefix = bt.st.unit_to_tokens(torch.exp(parts.Lambda))  # [B, L], exp(Lambda[t]) on the tokens of turn t
    nonempty = bt.st.seg_to_unit_mean(bt.seg_n) > 0  # [U]
    extra = M.interq_metrics(parts.kappa, parts.support, parts.Lambda, nonempty)
    return w_prefix * _w_token(bt, cfg), bt.valid, parts.Lambda, extra


def _interq(bt: _Batch, cfg: CorrectionConfig) -> _Out:
    return _interq_common(bt, cfg, uniform=False)


def _interq_uniform(bt: _Batch, cfg: CorrectionConfig) -> _Out:
    return _interq_common(bt, cfg, uniform=True)


_REGISTRY: dict[CorrectionMethod, Callable[[_Batch, CorrectionConfig], _Out]] = {
    CorrectionMethod.NONE: _none,
    CorrectionMethod.TIS: _tis,
    CorrectionMethod.ICEPOP: _icepop,
    CorrectionMethod.SEQ_IS: _seq_is,
    CorrectionMethod.GEO_MASK: _geo_mask,
    CorrectionMethod.PREFIX_IS: _prefix_is,
    CorrectionMethod.INTERQ: _interq,
    CorrectionMethod.INTERQ_UNIFORM: _interq_uniform,
}


# ---------------------------------------------------------------------------------------------------
# Public entry points


@torch.no_grad()
def compute_correction(
    method: str | CorrectionMethod,
    proximal_logprobs: Tensor,
    behavior_logprobs: Tensor,
    action_mask: Tensor,
    *,
    traj_id: Tensor | None = None,
    turn_idx: Tensor | None = None,
    config: CorrectionConfig = CorrectionConfig(),
) -> Correction:
    """Per-token weights, keep-mask and §7 metrics of ``method`` (one of ``METHODS``) on a batch.

    See the module docstring for layouts, duplicates and the output contract.
    """
    m = _method(method)
    if not isinstance(config, CorrectionConfig):
        raise TypeError(f"config must be a CorrectionConfig, got {type(config).__name__}")
    p, b, mask, tid, tix = _validate(proximal_logprobs, behavior_logprobs, action_mask, traj_id, turn_idx)
    bt = _prepare(p, b, mask, tid, tix)
    w, keep, lam_unit, extra = _REGISTRY[m](bt, config)
    w = torch.where(keep, w, 0.0)  # [B, L]
    n_keep = keep.sum()
    if config.normalize and int(n_keep) > 0:
        w = w / (w.sum() / n_keep)  # [B, L], mean 1 over the kept tokens
    metrics = M.mismatch_metrics(bt.delta_raw, mask, bt.valid, rho=bt.rho())
    metrics.update(M.weight_metrics(w, keep, mask))
    metrics.update(extra)
    metrics.update(_turn_metrics(bt, lam_unit))
    return Correction(
        weights=w.to(torch.float32),
        keep_mask=keep,
        metrics=metrics,
        lambda_=None if lam_unit is None else bt.st.unit_to_tokens(lam_unit).to(torch.float32),
    )


def _turn_metrics(bt: _Batch, lam_unit: Tensor | None) -> dict[str, float]:
    """Per-turn accumulation curves of §7 (one value per distinct turn, duplicates counted once)."""
    st = bt.st
    if st.num_units == 0:
        return {}
    ones = torch.ones(st.num_units, dtype=torch.float64, device=bt.delta.device)  # [U]
    raw = st.history_sum(st.seg_to_unit_mean(bt.seg_D))  # [U]
    curves = {
        "abs_delta_mean": (st.seg_to_unit_mean(bt.seg_abs), st.seg_to_unit_mean(bt.seg_n)),
        "abs_prefix_logratio": (raw.abs(), ones),
    }
    if lam_unit is not None:
        curves["abs_Lambda"] = (lam_unit.abs(), ones)
    return M.turn_curve_metrics(st.unit_rank, curves)


@torch.no_grad()
def interq_prefix_logweights(
    proximal_logprobs: Tensor,
    behavior_logprobs: Tensor,
    action_mask: Tensor,
    budget: float,
    *,
    traj_id: Tensor | None = None,
    turn_idx: Tensor | None = None,
    uniform_support: bool = False,
) -> Tensor:
    """Lambda (docs/algorithm.md, "The budget and its allocation") on every action token ([B, L] float32, 0 off action tokens).

    ``exp(Lambda)`` is the prefix weight w_prefix; ``uniform_support=True`` sets every s = 1
    (the ``interq_uniform`` ablation).
    """
    if isinstance(budget, bool) or not isinstance(budget, (int, float)) or math.isnan(budget) or budget < 0:
        raise ValueError(f"budget must be a number >= 0 (nats, inf allowed), got {budget!r}")
    p, b, mask, tid, tix = _validate(proximal_logprobs, behavior_logprobs, action_mask, traj_id, turn_idx)
    bt = _prepare(p, b, mask, tid, tix)
    parts = _interq_turns(bt, float(budget), uniform_support)
    return bt.st.unit_to_tokens(parts.Lambda).to(torch.float32)  # [B, L]


@torch.no_grad()
def interq_turn_profile(
    proximal_logprobs: Tensor,
    behavior_logprobs: Tensor,
    action_mask: Tensor,
    budget: float,
    *,
    traj_id: Tensor | None = None,
    turn_idx: Tensor | None = None,
    uniform_support: bool = False,
) -> dict[str, float]:
    """Per-turn curves of the §3 quantities next to the §7 ones (``interq mismatch``), flat keys
    ``turn/<curve>/<t>`` for the curves ``interq.algo.metrics.PROFILE_CURVES``:

    - ``signed_delta_mean``: token mean of delta (clamped, as in D[t]) over the turns number t;
    - ``budget_bound_frac``: share of the turns number t whose kappa < 1 (the budget binds);
    - ``support_mean``: mean effective support s over the turns number t that have a finite token;
    - ``turns``, ``action_tokens``: how many turns number t, and their finite action tokens.

    Same preparation and §3 arithmetic as ``compute_correction`` (``interq``, or ``interq_uniform`` with
    ``uniform_support``), so these curves agree with its ``interq/*`` and ``turn/*`` metrics by construction:
    e.g. the turn-count-weighted mean of ``budget_bound_frac`` is ``interq/budget_bound_frac``.
    """
    if isinstance(budget, bool) or not isinstance(budget, (int, float)) or math.isnan(budget) or budget < 0:
        raise ValueError(f"budget must be a number >= 0 (nats, inf allowed), got {budget!r}")
    p, b, mask, tid, tix = _validate(proximal_logprobs, behavior_logprobs, action_mask, traj_id, turn_idx)
    bt = _prepare(p, b, mask, tid, tix)
    st = bt.st
    if st.num_units == 0:
        return {}
    parts = _interq_turns(bt, float(budget), uniform_support)
    n = st.seg_to_unit_mean(bt.seg_n)  # [U] finite action tokens of each turn
    nonempty = (n > 0).to(torch.float64)  # [U]
    ones = torch.ones_like(n)  # [U]
    out = M.turn_curve_metrics(st.unit_rank, {
        "signed_delta_mean": (st.seg_to_unit_mean(bt.seg_D), n),
        "budget_bound_frac": ((parts.kappa < 1).to(torch.float64), ones),
        "support_mean": (parts.support * nonempty, nonempty),
    })
    t_max = int(st.unit_rank.max())
    idx = st.unit_rank - 1  # [U]
    counts = torch.zeros(t_max, dtype=torch.float64, device=n.device).index_add_(0, idx, ones)  # [T]
    tokens = torch.zeros(t_max, dtype=torch.float64, device=n.device).index_add_(0, idx, n)  # [T]
    for t, (c, k) in enumerate(zip(counts.tolist(), tokens.tolist()), start=1):
        out[M.turn_key("turns", t)] = c
        out[M.turn_key("action_tokens", t)] = k
    return out
