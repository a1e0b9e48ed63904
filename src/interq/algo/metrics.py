"""Per-step metrics (docs/algorithm.md, "Logged metrics"), as pure functions returning ``dict[str, float]``.

Names are stable (loggers and plots key on them):

- ``mismatch/k1``            mean over finite action tokens of ``behavior - proximal`` (= mean(-delta), raw).
- ``mismatch/k3``            mean of ``rho - log rho - 1``, ``rho = exp(delta)`` (delta clamped to [-20, 20]).
- ``mismatch/chi2_token``    mean of ``(rho - 1)^2`` (the chi-square divergence estimate, same clamp).
- ``mismatch/abs_delta_mean`` mean of ``|delta|`` (raw, before the clamp).
- ``mismatch/nonfinite_frac`` share of action tokens whose proximal or behavior log-prob is NaN/inf.
- ``weights/{mean,std,min,max,ess}`` over the kept action tokens, after every cap;
  ``ess = 1 / mean((w / mean w)^2)`` in (0, 1].  ``weights/keep_frac`` = kept / action tokens.
- ``interq/budget_bound_frac`` share of turns with kappa < 1 (a trajectory's first turn has no history, never
  binds and counts in the denominator; ``turn/budget_bound_frac/<t>`` gives it per turn number);
  ``interq/lambda_abs_mean`` mean |Lambda| over turns; ``interq/support_mean`` mean effective support s over
  non-empty turns; ``interq/kappa_mean`` mean kappa over turns.
- Per-turn accumulation curves, one key per turn number ``t = 1..T_max`` (t counts a trajectory's turns
  present in the batch, starting at 1), flat key format ``turn/<curve>/<t>``, e.g. ``turn/abs_Lambda/3``:
  ``turn/abs_delta_mean/<t>`` (token mean of |delta| over turns number t, delta clamped to [-20, 20] as in D[t]:
  the raw mean of ``mismatch/abs_delta_mean`` restricted to turn t unless a token's |delta| exceeds 20 nats),
  ``turn/abs_prefix_logratio/<t>`` (mean over turns number t of |sum_{k<t} D[k]|),
  ``turn/abs_Lambda/<t>`` (mean |Lambda[t]|; only for methods with a prefix weight).
  ``turn_curve(metrics, "abs_Lambda")`` reads a curve back as a list indexed by t - 1.
- Diagnostic per-turn curves (``interq mismatch``; not logged by the trainer), same key format, from
  ``interq.algo.corrections.interq_turn_profile``: ``turn/signed_delta_mean/<t>`` (token mean of delta),
  ``turn/budget_bound_frac/<t>`` (share of turns number t with kappa < 1), ``turn/support_mean/<t>`` (mean
  effective support s over turns number t with a finite token), ``turn/turns/<t>`` (how many turns number t)
  and ``turn/action_tokens/<t>`` (their finite action tokens).

Empty selections (no action token, no kept token) give 0.0, never NaN.  A "turn" is one distinct
(trajectory, turn) pair: duplicated per-turn rows count once in the turn-level metrics.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

TURN_CURVES = ("abs_delta_mean", "abs_prefix_logratio", "abs_Lambda")
PROFILE_CURVES = ("signed_delta_mean", "budget_bound_frac", "support_mean", "turns", "action_tokens")


def turn_key(curve: str, t: int) -> str:
    """Flat metric key of turn ``t`` (1-based) of an accumulation curve: ``turn/<curve>/<t>``."""
    if curve not in TURN_CURVES + PROFILE_CURVES:
        raise ValueError(f"curve={curve!r} is not a turn curve; accepted: {', '.join(TURN_CURVES + PROFILE_CURVES)}")
    if t < 1:
        raise ValueError(f"t={t} must be >= 1 (turns are numbered from 1)")
    return f"turn/{curve}/{t}"


def turn_curve(metrics: dict[str, float], curve: str) -> list[float]:
    """Read the curve ``curve`` back from a metrics dict as a list indexed by ``t - 1``."""
    turn_key(curve, 1)  # validates the name
    prefix = f"turn/{curve}/"
    pts = {int(k[len(prefix):]): v for k, v in metrics.items() if k.startswith(prefix)}
    return [pts[t] for t in sorted(pts)]


def _safe_div(num: Tensor, den: Tensor) -> Tensor:
    return torch.where(den > 0, num / den.clamp(min=1e-300), torch.zeros_like(num))


def mismatch_metrics(delta_raw: Tensor, action_mask: Tensor, finite_mask: Tensor, *, rho: Tensor | None = None) -> dict[str, float]:
    """``mismatch/*`` of §7.

    delta_raw [B, L] = proximal - behavior (any value off ``finite_mask``); finite_mask [B, L] bool =
    action tokens whose two log-probs are finite; rho [B, L] optional precomputed ``exp(clamp(delta))``
    (must be 1 off ``finite_mask`` when given).
    """
    d = torch.where(finite_mask, delta_raw.to(torch.float64), 0.0).reshape(-1)  # [B*L], 0 off the finite tokens
    dc = d.clamp(-20.0, 20.0)  # [B*L]
    e = (torch.exp(dc) if rho is None else rho.reshape(-1).to(torch.float64)) - 1.0  # [B*L] rho - 1, 0 off the finite tokens
    n = finite_mask.sum().to(torch.float64)
    n_action = action_mask.sum().to(torch.float64)
    sums = torch.stack([-d.sum(), e.sum() - dc.sum(), torch.dot(e, e), torch.linalg.vector_norm(d, 1)])  # [4]
    k1, k3, chi2, absd = _safe_div(sums, n.expand(4)).tolist()
    return {
        "mismatch/k1": k1,  # mean(behavior - proximal)
        "mismatch/k3": k3,  # mean(rho - log rho - 1)
        "mismatch/chi2_token": chi2,  # mean((rho - 1)^2)
        "mismatch/abs_delta_mean": absd,
        "mismatch/nonfinite_frac": float(_safe_div(n_action - n, n_action)),
    }


def weight_metrics(weights: Tensor, keep_mask: Tensor, action_mask: Tensor) -> dict[str, float]:
    """``weights/*`` of §7 over the kept action tokens.  weights [B, L], keep_mask/action_mask [B, L] bool."""
    w = torch.where(keep_mask, weights.to(torch.float64), 0.0).reshape(-1)  # [B*L], 0 off the keep-mask
    n = int(keep_mask.sum())
    n_action = int(action_mask.sum())
    if n:
        mean = w.sum() / n
        m2 = torch.dot(w, w) / n  # mean(w^2)
        var = (m2 - mean * mean).clamp(min=0.0)
        ess = mean * mean / m2 if float(m2) > 0 else m2.new_zeros(())  # 1 / mean((w / mean w)^2)
        wmin = torch.where(keep_mask.reshape(-1), w, math.inf).min()
        wmax = torch.where(keep_mask.reshape(-1), w, -math.inf).max()
        vals = torch.stack([mean, var.sqrt(), wmin, wmax, ess]).tolist()
    else:
        vals = [0.0] * 5
    return {
        "weights/mean": vals[0],
        "weights/std": vals[1],
        "weights/min": vals[2],
        "weights/max": vals[3],
        "weights/ess": vals[4],
        "weights/keep_frac": (n / n_action) if n_action else 0.0,
    }


def interq_metrics(kappa: Tensor, support: Tensor, lambda_turn: Tensor, turn_nonempty: Tensor) -> dict[str, float]:
    """``interq/*`` of §7.  Per-turn inputs [U]: kappa, support s, Lambda, and whether the turn has a finite token."""
    U = kappa.numel()
    if U == 0:
        return {"interq/budget_bound_frac": 0.0, "interq/lambda_abs_mean": 0.0, "interq/support_mean": 0.0, "interq/kappa_mean": 0.0}
    ne = turn_nonempty.to(torch.float64)  # [U]
    s_mean = _safe_div((support.to(torch.float64) * ne).sum(), ne.sum())
    vals = torch.stack([(kappa < 1).to(torch.float64).mean(), lambda_turn.abs().to(torch.float64).mean(), s_mean, kappa.to(torch.float64).mean()])
    bf, lam, s, k = vals.tolist()
    return {"interq/budget_bound_frac": bf, "interq/lambda_abs_mean": lam, "interq/support_mean": s, "interq/kappa_mean": k}


def turn_curve_metrics(turn_rank: Tensor, curves: dict[str, tuple[Tensor, Tensor]]) -> dict[str, float]:
    """Per-turn curves: for each ``curve -> (numerator [U], denominator [U])``, the value at turn t is
    ``sum num / sum den`` over the turns whose 1-based rank is t.  ``turn_rank`` [U] long."""
    if turn_rank.numel() == 0:
        return {}
    t_max = int(turn_rank.max())
    idx = turn_rank - 1  # [U]
    out: dict[str, float] = {}
    for name, (num, den) in curves.items():
        n = torch.zeros(t_max, dtype=torch.float64, device=num.device).index_add_(0, idx, num.to(torch.float64))  # [T]
        d = torch.zeros(t_max, dtype=torch.float64, device=num.device).index_add_(0, idx, den.to(torch.float64))  # [T]
        for t, v in enumerate(_safe_div(n, d).tolist(), start=1):
            out[turn_key(name, t)] = v
    return out
