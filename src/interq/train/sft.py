"""Warm start: supervised fine-tuning on expert demonstrations.

The demonstrations are rendered with the *same* chat format the rollout engine uses (token in, token out),
and the loss is the mean cross-entropy of the action tokens plus ``observation_weight`` times the mean
cross-entropy of the observation tokens. Classic SFT trains actions only (``observation_weight=0``, right for
a pretrained checkpoint). A tiny policy built from a config has had no pre-training: predicting the
environment's own text (the admissible list repeats the names the observation just mentioned) is what teaches
it to copy a name from its context into its answer, and it decides whether the warm start works at all
(docs/results.md: 26% held-out success with ``observation_weight=1`` against 4% without, same steps). How good
the starting policy is is set by ``WarmStartConfig``: ``noise`` (share of random admissible actions written
into the demos), ``num_demos`` and ``steps``.

Memory is bounded by configuration: ``warm_start.tokens_per_microbatch`` caps the padded tokens of one forward (the
``episodes_per_microbatch`` episodes of a step are split into as many forwards as that needs, their gradients
accumulated into the step's one update: the same loss, to float rounding), and a pretrained model recomputes each
decoder layer in the backward instead of keeping its activations. Its default, 0, keeps a tiny policy's step in one
forward (bit for bit the numbers before the cap existed) and gives a pretrained checkpoint 4,096 tokens: a
SmolLM2-135M step then holds one 4,096-token forward's activations and LM-head logits, not 64 episodes' at once.
A loss that is not finite stops the warm start at once; nothing is saved.
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


def _head_logits(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, predict: torch.Tensor) -> torch.Tensor:
    """Logits [N, V] at the positions ``predict`` [B, L-1] marks (position l predicts token l+1).

    The LM head runs only there, not over the whole [B, L, V] logits: the same values, a fraction of the cost.
    """
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)  # [B, L]
    body, head = getattr(model, "model", None), getattr(model, "lm_head", None)
    if body is not None and head is not None:
        hidden = body(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).last_hidden_state  # [B, L, H]
        return head(hidden[:, :-1][predict]).float()  # [N, V]
    full = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).logits  # [B, L, V]
    return full[:, :-1][predict].float()  # [N, V]


def action_nll(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, action_mask: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Summed negative log-likelihood of the action tokens and their count."""
    nll, n, _, _ = token_nll(model, input_ids, attention_mask, action_mask, observations=False)
    return nll, n


def token_nll(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, action_mask: torch.Tensor,
              observations: bool = True) -> tuple[torch.Tensor, int, torch.Tensor, int]:
    """(action NLL sum, action tokens, observation NLL sum, observation tokens) of right-padded rows.

    Observation tokens are every non-padding token after a row's first that is not an action token
    (environment text and chat markers). ``observations=False`` skips them (0 and 0) and runs the LM head
    at the action positions only.
    """
    target_mask = action_mask[:, 1:]  # [B, L-1]
    predict = attention_mask[:, 1:].bool() if observations else target_mask  # [B, L-1]
    logits = _head_logits(model, input_ids, attention_mask, predict)  # [N, V]
    targets = input_ids[:, 1:][predict]  # [N]
    logp = torch.log_softmax(logits, dim=-1).gather(-1, targets[:, None]).squeeze(-1)  # [N]
    is_action = target_mask[predict]  # [N]
    zero = logp.new_zeros(())
    obs = -logp[~is_action].sum() if observations else zero
    return -logp[is_action].sum(), int(is_action.sum()), obs, int((~is_action).sum())


PRETRAINED_TOKENS_PER_MICROBATCH = 4096  # warm_start.tokens_per_microbatch=0 (auto) for a pretrained checkpoint


def resolve_tokens_per_microbatch(cfg: WarmStartConfig, pretrained: bool) -> int:
    """``warm_start.tokens_per_microbatch``, ``0`` (auto) resolved: no limit (0) for a policy built from the config,
    :data:`PRETRAINED_TOKENS_PER_MICROBATCH` for a pretrained checkpoint."""
    if cfg.tokens_per_microbatch:
        return cfg.tokens_per_microbatch
    return PRETRAINED_TOKENS_PER_MICROBATCH if pretrained else 0


def pack_rows(lengths: Sequence[int], budget: int) -> list[list[int]]:
    """Split row positions ``0..n-1`` (in order) into micro-batches whose rows x longest row stays <= ``budget``
    padded tokens (a row longer than the budget alone); ``budget`` 0: one micro-batch."""
    if budget <= 0:
        return [list(range(len(lengths)))]
    out: list[list[int]] = []
    cur: list[int] = []
    width = 0
    for i, n in enumerate(lengths):
        w = max(width, n)
        if cur and (len(cur) + 1) * w > budget:
            out.append(cur)
            cur, w = [], n
        cur.append(i)
        width = w
    if cur:
        out.append(cur)
    return out


def _counts(row: tuple[list[int], list[bool]]) -> tuple[int, int]:
    """(action tokens, observation tokens) that :func:`token_nll` scores in a row (every position after the first)."""
    ids, mask = row
    acts = sum(1 for m in mask[1: len(ids)] if m)
    return acts, max(len(ids) - 1, 0) - acts


def run_sft(
    model,
    rows: Sequence[tuple[list[int], list[bool]]],
    cfg: WarmStartConfig,
    pad_id: int,
    progress: Callable[[int, dict], None] | None = None,
    tokens_per_microbatch: int = 0,
    checkpoint_layers: bool = False,
) -> dict:
    """Train ``model`` in place on rendered demos; returns a summary (final loss, seconds, tokens, peak memory).

    Each step draws ``warm_start.episodes_per_microbatch`` rows; they are one forward when ``tokens_per_microbatch``
    is 0 or they fit it, else they are split (in order) into forwards of at most that many padded tokens whose
    gradients are accumulated into the one optimizer step: the loss is the same mean over the step's tokens.
    ``checkpoint_layers``: each decoder layer's activations are recomputed in the backward (less memory, the same
    gradients). A loss that is not finite stops the fine-tuning at once (:class:`NonFiniteTrainingError`, naming the
    step): nothing is saved from it."""
    from interq.train.config import NonFiniteTrainingError

    if not rows:
        raise ValueError("run_sft: no demonstration rows (warm_start.num_demos must be > 0)")
    gen = torch.Generator().manual_seed(cfg.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.98), weight_decay=0.0)
    warmup = max(1, cfg.steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(s, cfg.steps) / max(1, cfg.steps))))
    if checkpoint_layers:
        from interq.train.rl import enable_activation_checkpointing

        enable_activation_checkpointing(model)
    model.train()
    t0 = time.time()
    losses: list[float] = []
    obs_losses: list[float] = []
    tokens = 0
    forwards = 0
    weight = cfg.observation_weight
    bs = min(cfg.episodes_per_microbatch, len(rows))
    try:
        for step in range(cfg.steps):
            idx = torch.randperm(len(rows), generator=gen)[:bs].tolist()
            picked = [rows[i] for i in idx]
            counts = [_counts(r) for r in picked]
            n_all, n_obs_all = sum(c[0] for c in counts), sum(c[1] for c in counts)
            opt.zero_grad(set_to_none=True)
            nll_sum, obs_sum, n_seen = 0.0, 0.0, 0
            for part in pack_rows([len(r[0]) for r in picked], tokens_per_microbatch):
                ids, att, act = pad_rows([picked[i] for i in part], pad_id)
                nll, n, obs_nll, n_obs = token_nll(model, ids, att, act, observations=weight > 0)
                loss = nll / max(n_all, 1) + weight * obs_nll / max(n_obs_all, 1)
                loss.backward()
                forwards += 1
                nll_sum += float(nll.detach())
                obs_sum += float(obs_nll.detach())
                n_seen += n
            losses.append(nll_sum / max(n_all, 1))
            obs_losses.append(obs_sum / max(n_obs_all, 1))
            if not (math.isfinite(losses[-1]) and math.isfinite(obs_losses[-1])):
                what = "action" if not math.isfinite(losses[-1]) else "observation"
                raise NonFiniteTrainingError(
                    f"the warm start diverged: its {what} loss is {losses[-1] if what == 'action' else obs_losses[-1]} "
                    f"at step {step + 1}/{cfg.steps} (warm_start.lr={cfg.lr:g}); nothing was saved. Lower "
                    "warm_start.lr")
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            tokens += n_seen
            if progress is not None:
                progress(step, {"loss": losses[-1], "observation_loss": obs_losses[-1]})
    finally:
        if checkpoint_layers:
            from interq.train.rl import enable_activation_checkpointing

            enable_activation_checkpointing(model, False)
    model.eval()
    k = max(1, len(losses) // 10)
    from interq.rundir import peak_rss_mib

    out = {"sft/steps": cfg.steps, "sft/final_loss": sum(losses[-k:]) / k, "sft/seconds": time.time() - t0,
           "sft/action_tokens": tokens, "sft/rows": len(rows), "sft/forwards": forwards,
           "sft/tokens_per_microbatch": tokens_per_microbatch, "sft/peak_rss_mib": round(peak_rss_mib(), 1)}
    if weight > 0:
        out["sft/final_observation_loss"] = sum(obs_losses[-k:]) / k
    return out
