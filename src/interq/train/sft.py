"""Warm start: supervised fine-tuning on expert demonstrations (issue 6, item 2).

The demonstrations are rendered with the *same* chat format the rollout engine uses (token in, token out),
and the loss is the cross-entropy of the action tokens only (observations are never trained). How good the
starting policy is is set by ``WarmStartConfig``: ``noise`` (share of random admissible actions written into
the demos by :mod:`interq.envs.demos`), ``num_demos`` and ``steps``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

import torch

from interq.train.config import WarmStartConfig


def pad_rows(rows: Sequence[tuple[list[int], list[bool]]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-pad (ids, action_mask) rows -> input_ids [B, L], attention_mask [B, L], action_mask [B, L] bool."""
    width = max(len(ids) for ids, _ in rows)
    ids_t = torch.full((len(rows), width), pad_id, dtype=torch.long)  # [B, L]
    att = torch.zeros((len(rows), width), dtype=torch.long)  # [B, L]
    act = torch.zeros((len(rows), width), dtype=torch.bool)  # [B, L]
    for i, (ids, mask) in enumerate(rows):
        ids_t[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        att[i, : len(ids)] = 1
        act[i, : len(ids)] = torch.tensor(mask, dtype=torch.bool)
    return ids_t, att, act


def action_nll(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, action_mask: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Summed negative log-likelihood of the action tokens and their count.

    The LM head runs only at the positions that predict an action token (a few % of a row), not over the
    whole [B, L, V] logits: the same loss, a fraction of the head's cost.
    """
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)  # [B, L]
    target_mask = action_mask[:, 1:]  # [B, L-1]: position l predicts token l+1
    targets = input_ids[:, 1:][target_mask]  # [N]
    body, head = getattr(model, "model", None), getattr(model, "lm_head", None)
    if body is not None and head is not None:
        hidden = body(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).last_hidden_state  # [B, L, H]
        logits = head(hidden[:, :-1][target_mask]).float()  # [N, V]
    else:  # any other causal LM: full logits
        full = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).logits  # [B, L, V]
        logits = full[:, :-1][target_mask].float()  # [N, V]
    logp = torch.log_softmax(logits, dim=-1).gather(-1, targets[:, None]).squeeze(-1)  # [N]
    return -logp.sum(), int(targets.numel())


def run_sft(
    model,
    rows: Sequence[tuple[list[int], list[bool]]],
    cfg: WarmStartConfig,
    pad_id: int,
    progress: Callable[[int, dict], None] | None = None,
) -> dict:
    """Train ``model`` in place on rendered demos; returns a summary (final loss, seconds, tokens)."""
    if not rows:
        raise ValueError("run_sft: no demonstration rows (warm_start.num_demos must be > 0)")
    gen = torch.Generator().manual_seed(cfg.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.98), weight_decay=0.0)
    warmup = max(1, cfg.steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(s, cfg.steps) / max(1, cfg.steps))))
    model.train()
    t0 = time.time()
    losses: list[float] = []
    tokens = 0
    bs = min(cfg.episodes_per_microbatch, len(rows))
    for step in range(cfg.steps):
        idx = torch.randperm(len(rows), generator=gen)[:bs].tolist()
        ids, att, act = pad_rows([rows[i] for i in idx], pad_id)
        nll, n = action_nll(model, ids, att, act)
        loss = nll / max(n, 1)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
        tokens += n
        if progress is not None:
            progress(step, {"loss": losses[-1]})
    model.eval()
    tail = losses[-max(1, len(losses) // 10):]
    return {"sft/steps": cfg.steps, "sft/final_loss": sum(tail) / len(tail), "sft/seconds": time.time() - t0,
            "sft/action_tokens": tokens, "sft/rows": len(rows)}
