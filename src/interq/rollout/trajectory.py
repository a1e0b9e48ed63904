"""The record of one episode (token in, token out) and the learner-side helpers that consume it.

A :class:`Trajectory` holds the token ids exactly as the executor saw them, in order, one flat row:

    [obs chunk 0][action 0][obs chunk 1][action 1] ... [action T-1]

* ``token_ids``          [L] long: every token fed to (or sampled by) the executor. Nothing is re-tokenized.
* ``action_mask``        [L] bool: True on sampled action tokens (trainable), False on observation /
                         chat-scaffolding tokens. A stop token that was sampled is an action token.
* ``behavior_logprobs``  [L] fp32: the executor's log-prob of each sampled token under the distribution it was
                         sampled from (the :class:`SamplingParams` transform); 0.0 on non-action tokens.
                         Aligned to the token itself (not shifted): ``behavior_logprobs[l]`` belongs to
                         ``token_ids[l]`` predicted from ``token_ids[:l]``.
* ``turn_index``         [L] long: turn t of each token (observation chunk t and action t share t).
* ``turns``              one :class:`TurnSpan` per turn (token offsets and the stop reason).
* ``truncated``          True when the per-episode context limit cut the episode.
* ``sampling``           the :class:`SamplingParams` used for every action of the episode.

The learner computes its own log-probs on exactly these ids with :func:`sequence_logprobs`, which uses the
same alignment, so ``(proximal - behavior)[action_mask]`` is the token log-ratio delta of docs/algorithm.md.
Segments (the concatenated layout of docs/algorithm.md) are the maximal runs of 1 in ``action_mask``; a turn whose
action is empty (context truncation before sampling) contributes no segment.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from interq.rollout.sampling import SamplingParams, transformed_logprobs

STOP_REASONS = ("stop", "length", "context")


@dataclass(frozen=True)
class TurnSpan:
    obs_start: int     # offset of the turn's first observation token (== act_start when the chunk was empty)
    act_start: int     # offset of the first action token
    act_end: int       # one past the last action token (== act_start when no token was sampled)
    stop_reason: str   # "stop" (a stop token was sampled), "length" (per-turn limit), "context" (context limit)


@dataclass(frozen=True)
class Trajectory:
    episode: int
    seed: int
    token_ids: torch.Tensor          # [L] long
    action_mask: torch.Tensor        # [L] bool
    behavior_logprobs: torch.Tensor  # [L] fp32, 0 off actions
    turn_index: torch.Tensor         # [L] long
    turns: tuple[TurnSpan, ...]
    truncated: bool
    sampling: SamplingParams
    info: dict[str, Any] = field(default_factory=dict)  # e.g. executor / quantization config

    def __len__(self) -> int:
        return int(self.token_ids.shape[0])

    def action_ids(self, turn: int) -> list[int]:
        span = self.turns[turn]
        return self.token_ids[span.act_start : span.act_end].tolist()

    @property
    def num_action_tokens(self) -> int:
        return int(self.action_mask.sum())


def collate_trajectories(trajectories: Sequence[Trajectory], pad_token_id: int = 0) -> dict[str, torch.Tensor]:
    """Right-pad trajectories into one batch (concatenated layout, one row per trajectory).

    Returns ``input_ids`` [B, L], ``attention_mask`` [B, L] long, ``action_mask`` [B, L] bool,
    ``behavior_logprobs`` [B, L] fp32 (0 off actions and on padding), ``turn_index`` [B, L] (-1 on padding).
    """
    if not trajectories:
        raise ValueError("collate_trajectories needs at least one trajectory")
    n = len(trajectories)
    width = max(len(t) for t in trajectories)
    input_ids = torch.full((n, width), pad_token_id, dtype=torch.long)  # [B, L]
    attention_mask = torch.zeros((n, width), dtype=torch.long)  # [B, L]
    action_mask = torch.zeros((n, width), dtype=torch.bool)  # [B, L]
    behavior = torch.zeros((n, width), dtype=torch.float32)  # [B, L]
    turn_index = torch.full((n, width), -1, dtype=torch.long)  # [B, L]
    for i, t in enumerate(trajectories):
        m = len(t)
        input_ids[i, :m] = t.token_ids
        attention_mask[i, :m] = 1
        action_mask[i, :m] = t.action_mask
        behavior[i, :m] = t.behavior_logprobs
        turn_index[i, :m] = t.turn_index
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "action_mask": action_mask,
        "behavior_logprobs": behavior,
        "turn_index": turn_index,
    }


def model_attention_mask(attention_mask: torch.Tensor) -> torch.Tensor | None:
    """The mask to give a causal LM's forward over rows ``attention_mask`` [B, L]: ``None`` (causal attention alone)
    when every row is right-padded (its ones, then its zeros), else the mask itself.

    Right padding needs no mask for the real tokens: a real position attends only to earlier positions, all real,
    so causal attention gives them exactly the values the padded mask gives (the same kernel bits; a pad position
    then attends to the pads before it as well, and its outputs are never read). Without a mask transformers'
    ``sdpa`` runs torch's causal kernel, which skips the blocks above the diagonal: measured 1.7x faster than the
    same attention with a mask (forward and backward, 2 rows x 1,800 tokens, 1 thread), about 20% of a SmolLM2
    learner pass."""
    lengths = attention_mask.sum(-1, keepdim=True)  # [B, 1]
    right_padded = attention_mask.bool() == (torch.arange(attention_mask.shape[-1], device=attention_mask.device) < lengths)
    return None if bool(right_padded.all()) else attention_mask


def sequence_logprobs(
    model: torch.nn.Module,
    token_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    rows_per_chunk: int = 4,
    score_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Learner log-probs of every token given its prefix, aligned like ``behavior_logprobs``. -> [B, L] fp32.

    ``score_mask`` ([B, L] bool, optional): only these tokens are scored, every other position is 0. The model
    then projects to the vocabulary only at the sequence positions some row scores (HF ``logits_to_keep``), which
    saves most of the lm-head and log-softmax work when, as in RL, few tokens of long prompts are actions; the
    scored values equal the full computation's.

    ``out[b, l] = log p(token_ids[b, l] | token_ids[b, :l])`` under the same transform the executor sampled
    with (pass the trajectory's ``sampling.temperature``, and top_k / top_p if you want the truncated
    distribution); ``out[:, 0] = 0`` and padding positions are 0. Runs one forward over the whole batch;
    gradients flow when called outside ``torch.no_grad()`` (current log-probs), use ``no_grad`` for the
    proximal pass. Rows must be right-padded (as :func:`collate_trajectories` makes them); position ids are
    ``0..len-1`` per row, as the engine used.
    """
    if token_ids.ndim != 2:
        raise ValueError(f"token_ids must be [B, L], got shape {tuple(token_ids.shape)}")
    if attention_mask is None:
        attention_mask = torch.ones_like(token_ids)  # [B, L]
    attention_mask = attention_mask.to(token_ids.device)
    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)  # [B, L]
    if score_mask is not None:
        return _scored_logprobs(model, token_ids, attention_mask, position_ids, score_mask, temperature, top_k, top_p)
    logits = model(input_ids=token_ids, attention_mask=model_attention_mask(attention_mask),
                   position_ids=position_ids).logits  # [B, L, V]
    pieces = []
    for start in range(0, token_ids.shape[0], rows_per_chunk):
        rows = slice(start, start + rows_per_chunk)
        logp = transformed_logprobs(logits[rows, :-1], temperature, top_k, top_p)  # [b, L-1, V]
        pieces.append(logp.gather(-1, token_ids[rows, 1:, None]).squeeze(-1))  # [b, L-1]
    shifted = torch.cat(pieces, dim=0)  # [B, L-1]
    shifted = torch.where(attention_mask[:, 1:].bool(), shifted, torch.zeros_like(shifted))  # [B, L-1]
    first = torch.zeros_like(shifted[:, :1])  # [B, 1]
    return torch.cat([first, shifted], dim=1)  # [B, L]


def _scored_logprobs(model, token_ids, attention_mask, position_ids, score_mask, temperature, top_k, top_p):
    """:func:`sequence_logprobs` restricted to ``score_mask``: logits only at the positions predicting a scored token."""
    scored = score_mask.to(token_ids.device).bool() & attention_mask.bool()  # [B, L]
    scored[:, 0] = False  # the first token has no prefix
    keep = scored[:, 1:].any(0).nonzero().squeeze(-1)  # [K] positions l-1 whose next token some row scores
    out = torch.zeros(token_ids.shape, dtype=torch.float32, device=token_ids.device)  # [B, L]
    if keep.numel() == 0:
        return out
    logits = model(input_ids=token_ids, attention_mask=model_attention_mask(attention_mask), position_ids=position_ids,
                   logits_to_keep=keep).logits  # [B, K, V]
    logp = transformed_logprobs(logits, temperature, top_k, top_p)  # [B, K, V]
    targets = token_ids[:, keep + 1]  # [B, K]
    vals = logp.gather(-1, targets[..., None]).squeeze(-1)  # [B, K]
    vals = torch.where(scored[:, keep + 1], vals, torch.zeros_like(vals))  # [B, K]
    return out.index_put((torch.arange(out.shape[0], device=out.device)[:, None], (keep + 1)[None, :]), vals)  # [B, L]
