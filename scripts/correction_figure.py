"""Draw the InterQ correction over one synthetic 12-turn episode (docs/correction.png).

    .venv/bin/python scripts/correction_figure.py [--out docs/correction.png]

The episode's per-token log-ratios delta = log pi_old - log mu are drawn from a fixed generator with a drift
that grows along the episode (as the executor's quantized KV cache lengthens), a few turns carry one large
outlier token (low effective support). Every plotted quantity comes from the library's own functions:
``interq_prefix_logweights`` for Lambda and ``compute_correction`` for the weights, so the figure shows what a
training step computes. Top: the raw prefix log-ratio sum_{k<t} D[k] that an uncorrected history weight would
use, InterQ's Lambda[t] at budget B = 0.5 and with no budget, and the band |Lambda| <= B. Bottom: the weight
applied to each turn's tokens by the history part of interq and prefix_is (capped at 2).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import torch


def synthetic_episode(turns: int = 12, tokens: int = 6, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(proximal, behavior, action_mask) of one episode in the concatenated layout: [1, L] each."""
    g = torch.Generator().manual_seed(seed)
    obs = 4  # observation tokens before every action
    L = turns * (obs + tokens)
    behavior = torch.full((1, L), -1.0, dtype=torch.float64)
    delta = torch.zeros(1, L, dtype=torch.float64)
    mask = torch.zeros(1, L, dtype=torch.bool)
    for t in range(turns):
        start = t * (obs + tokens) + obs
        d = 0.004 * (t + 1) + 0.04 * torch.randn(tokens, generator=g, dtype=torch.float64)
        if t in (3, 7):  # one poorly supported token dominates the turn
            d[2] += 0.9
        delta[0, start:start + tokens] = d
        mask[0, start:start + tokens] = True
    return behavior + delta, behavior, mask


def per_turn(values: torch.Tensor, mask: torch.Tensor) -> list[float]:
    """The value of each turn (first action token of each run of the mask)."""
    m = mask[0]
    starts = [i for i in range(m.numel()) if m[i] and (i == 0 or not m[i - 1])]
    return [float(values[0, i]) for i in starts]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="docs/correction.png")
    ap.add_argument("--budget", type=float, default=0.5)
    args = ap.parse_args(argv)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from interq.algo.corrections import CorrectionConfig, compute_correction, interq_prefix_logweights

    prox, beh, mask = synthetic_episode()
    B = args.budget
    lam = per_turn(interq_prefix_logweights(prox, beh, mask, B), mask)
    lam_inf = per_turn(interq_prefix_logweights(prox, beh, mask, math.inf), mask)
    no_tok = dict(token_correction=False)
    w_interq = per_turn(compute_correction("interq", prox, beh, mask, config=CorrectionConfig(budget=B, **no_tok)).weights, mask)
    w_prefix = per_turn(compute_correction("prefix_is", prox, beh, mask, config=CorrectionConfig(**no_tok)).weights, mask)
    delta = (prox - beh)[mask].reshape(-1, 6).sum(1)  # D[t] per turn
    raw = torch.cat([delta.new_zeros(1), torch.cumsum(delta, 0)[:-1]]).tolist()
    t = list(range(1, len(lam) + 1))

    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(6.4, 5.0), sharex=True, dpi=100)
    ax1.axhspan(-B, B, color="0.92", label=f"|Lambda| <= B = {B}")
    ax1.plot(t, raw, "o-", color="tab:red", label="raw prefix log-ratio  sum_{k<t} D[k]")
    ax1.plot(t, lam_inf, "s--", color="tab:orange", label="support-weighted prefix (B = inf)")
    ax1.plot(t, lam, "^-", color="tab:blue", label=f"InterQ Lambda[t] (B = {B})")
    ax1.set_ylabel("nats")
    ax1.set_title("The history correction over one synthetic episode")
    ax1.legend(fontsize=8, loc="upper left")
    ax2.plot(t, w_prefix, "o-", color="tab:red", label="prefix_is: min(exp(sum D), 2)")
    ax2.plot(t, w_interq, "^-", color="tab:blue", label=f"interq: exp(Lambda[t]), B = {B}")
    ax2.axhline(1.0, color="0.5", lw=0.8)
    ax2.set_xlabel("turn t")
    ax2.set_ylabel("history weight of turn t")
    ax2.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
