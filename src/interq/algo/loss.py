"""Decoupled PPO loss (docs/algorithm.md, "The loss") with correction weights and keep-mask.

``ratio = exp(current - proximal)``;
``loss_token = -w * min(ratio * A, clip(ratio, 1 - eps_low, 1 + eps_high) * A)`` on kept tokens.

Aggregations (``LossAggregation``):

- ``token_mean``: sum over the kept action tokens / number of kept tokens.  Pass ``num_tokens`` = the
  kept-token count of the whole mini-batch when the mini-batch is split into micro-batches: the sum of
  the micro-batch losses (and gradients) then equals the full mini-batch loss.
- ``seq_mean_token_mean``: the token mean inside each sequence, then the mean over sequences that have
  at least one kept token.  ``num_seqs`` plays the same role for gradient accumulation. A sequence is a row,
  or, with ``seq_ids`` (the per-turn layout's ``traj_id``), all rows of one trajectory: then both layouts of
  the same episodes give the same loss, and a long failed episode weighs as much as a short successful one.

The weights and the keep-mask come from ``interq.algo.corrections.compute_correction``; weights are
detached here as well.  Tokens outside the keep-mask never touch the arithmetic (NaN / inf there is
harmless), and the log-ratio is clamped to [-20, 20] before ``exp``.
"""

from __future__ import annotations

from enum import Enum

import torch
from torch import Tensor

LOG_RATIO_CLAMP = 20.0


class LossAggregation(str, Enum):
    TOKEN_MEAN = "token_mean"
    SEQ_MEAN_TOKEN_MEAN = "seq_mean_token_mean"


AGGREGATIONS: tuple[str, ...] = tuple(a.value for a in LossAggregation)


def _check(name: str, x: object, shape: torch.Size) -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.shape != shape:
        raise ValueError(f"{name} shape {tuple(x.shape)} does not match current_logprobs shape {tuple(shape)}")
    return x


def ppo_loss(
    current_logprobs: Tensor,
    proximal_logprobs: Tensor | None,
    advantages: Tensor,
    weights: Tensor | None,
    keep_mask: Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    aggregation: str | LossAggregation = LossAggregation.TOKEN_MEAN,
    num_tokens: int | float | None = None,
    num_seqs: int | float | None = None,
    seq_ids: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Decoupled PPO loss (§6).  Returns (scalar loss with grad through ``current_logprobs``, metrics).

    current_logprobs [B, L] (with grad); proximal_logprobs [B, L] or None (None: ``current.detach()``,
    the one-epoch/one-mini-batch case); advantages [B, L] or [B] (per row, broadcast); weights [B, L] or
    None (all 1); keep_mask [B, L] bool.
    """
    if not isinstance(current_logprobs, Tensor) or current_logprobs.dim() != 2 or not current_logprobs.is_floating_point():
        raise TypeError("current_logprobs must be a floating torch.Tensor [B, L]")
    shape = current_logprobs.shape
    B = shape[0]
    try:
        agg = LossAggregation(aggregation)
    except ValueError:
        raise ValueError(f"unknown aggregation={aggregation!r}; accepted: {', '.join(AGGREGATIONS)}") from None
    if not (0 <= eps_low < 1) or not (eps_high >= 0):
        raise ValueError(f"need 0 <= eps_low < 1 and eps_high >= 0, got eps_low={eps_low}, eps_high={eps_high}")
    keep = _check("keep_mask", keep_mask, shape)
    if keep.dtype != torch.bool:
        raise TypeError(f"keep_mask must have dtype torch.bool, got {keep.dtype}")
    prox = current_logprobs.detach() if proximal_logprobs is None else _check("proximal_logprobs", proximal_logprobs, shape).detach()
    if not isinstance(advantages, Tensor):
        raise TypeError(f"advantages must be a torch.Tensor [B, L] or [B], got {type(advantages).__name__}")
    if advantages.shape == (B,):
        advantages = advantages[:, None].expand(shape)
    adv = _check("advantages", advantages, shape).detach()
    w = torch.ones(shape, device=current_logprobs.device) if weights is None else _check("weights", weights, shape).detach()

    zero = torch.zeros((), dtype=current_logprobs.dtype, device=current_logprobs.device)
    log_ratio = torch.where(keep, current_logprobs - prox, zero).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)  # [B, L]
    ratio = torch.exp(log_ratio)  # [B, L]
    a = torch.where(keep, adv, zero)  # [B, L]
    wk = torch.where(keep, w, zero)  # [B, L]
    unclipped = ratio * a  # [B, L]
    clipped = ratio.clamp(1.0 - eps_low, 1.0 + eps_high) * a  # [B, L]
    loss_tok = -wk * torch.minimum(unclipped, clipped)  # [B, L], 0 off the keep-mask
    kf = keep.to(loss_tok.dtype)  # [B, L]

    if agg is LossAggregation.TOKEN_MEAN:
        denom = kf.sum() if num_tokens is None else torch.as_tensor(float(num_tokens))
        loss = loss_tok.sum() / denom.clamp(min=1.0)
    else:
        row_sum, row_n = loss_tok.sum(1), kf.sum(1)  # [B], [B]
        if seq_ids is not None:
            if not isinstance(seq_ids, Tensor) or seq_ids.shape != (B,):
                raise ValueError(f"seq_ids must be a tensor of shape [{B}] (one id per row), got {getattr(seq_ids, 'shape', seq_ids)}")
            _, inv = torch.unique(seq_ids, return_inverse=True)  # [B] -> sequence index
            n_seq = int(inv.max()) + 1 if B else 0
            row_sum = torch.zeros(n_seq, dtype=row_sum.dtype, device=row_sum.device).index_add(0, inv, row_sum)  # [S]
            row_n = torch.zeros(n_seq, dtype=row_n.dtype, device=row_n.device).index_add(0, inv, row_n)  # [S]
        seq_mean = row_sum / row_n.clamp(min=1.0)  # [S]
        denom = (row_n > 0).to(loss_tok.dtype).sum() if num_seqs is None else torch.as_tensor(float(num_seqs))
        loss = seq_mean.sum() / denom.clamp(min=1.0)

    with torch.no_grad():
        n = kf.sum().clamp(min=1.0)
        lr = log_ratio.detach()
        r = ratio.detach()
        clip_hi = keep & (a > 0) & (r > 1.0 + eps_high)  # [B, L] gradient removed by the upper clip
        clip_lo = keep & (a < 0) & (r < 1.0 - eps_low)  # [B, L] gradient removed by the lower clip
        stats = torch.stack(
            [
                (clip_hi | clip_lo).to(lr.dtype).sum() / n,
                clip_hi.to(lr.dtype).sum() / n,
                clip_lo.to(lr.dtype).sum() / n,
                ((r - 1.0 - lr) * kf).sum() / n,  # k3 estimate of KL(pi_old || pi_theta)
                (r * kf).sum() / n,
                torch.where(keep, r, torch.full_like(r, -torch.inf)).max() if keep.any() else zero,
                torch.where(keep, r, torch.full_like(r, torch.inf)).min() if keep.any() else zero,
                kf.sum(),
            ]
        ).tolist()
    metrics = {
        "ppo/loss": float(loss.detach()),
        "ppo/clip_frac": stats[0],
        "ppo/clip_frac_high": stats[1],
        "ppo/clip_frac_low": stats[2],
        "ppo/approx_kl": stats[3],
        "ppo/ratio_mean": stats[4],
        "ppo/ratio_max": stats[5],
        "ppo/ratio_min": stats[6],
        "ppo/kept_tokens": stats[7],
    }
    return loss, metrics
