"""The RL loop: one readable file (docs/algorithm.md).

Each step:

1. **rollout**  ``tasks_per_step`` task instances x ``episodes_per_task`` episodes played by the *executor*
   (bf16 copy or the W8A8-KV8 executor of :mod:`interq.quant`) through :mod:`interq.agent.loop`; behaviour
   log-probs come from the engine (exact, under the sampling transform).
2. **rows**  concatenated layout: one row per episode (full history); per_turn: one row per (episode, turn)
   with ``traj_id`` / ``turn_idx`` (spec §5).
3. **advantages**  GRPO over each task's group of episodes, or GiGPO (episode + anchor-state step
   advantages), broadcast to the action tokens (spec §6).
4. **proximal pass**  the learner's no-grad forward at the rollout parameters (aligned forward when
   ``algo.align``). Skipped when it equals the current forward (one PPO epoch, one mini-batch, a keep-mask that
   does not depend on it, no weight normalisation): then ``proximal = current.detach()`` inside the gradient pass.
5. **correction**  ``interq.algo.corrections.compute_correction`` (any method of spec §4) -> per-token weights,
   keep-mask and the §7 metrics.
6. **update**  decoupled PPO (spec §6) over ``minibatches_per_step`` mini-batches x ``ppo_epochs``, each
   mini-batch accumulated over micro-batches of at most ``tokens_per_microbatch`` padded tokens; one optimizer
   step per mini-batch; gradient clipping.
7. **sync**  the learner's new weights re-quantized into the executor (``interq.quant.sync_weights``).
8. **eval** every ``eval_every_steps`` on the held-out split; **checkpoint** every ``checkpoint_every_steps``.

Learner forwards are counted: ``learner/forward_calls`` (a forward hook: one per length bucket of a micro-batch),
``learner/forward_passes`` (passes over the step's batch) and ``learner/distinct_row_frac`` (the share of rows a
pass computed: a repeated row is computed once). q-interq adds none over q-tis: the correction is a pure function
of log-probs already computed.

Deliberate departures from the paper (arXiv 2610.35303, only its abstract is public):

* The environments run in-process by default (the household environment is pure Python); ``env.num_workers=N``
  steps them in an ``EnvPool`` of N worker processes (slow engines: ALFWorld, ScienceWorld), in waves of N
  episodes (:mod:`interq.agent.loop`). Generation and environment steps alternate; they do not overlap.
* An episode whose environment worker crashed or hung (``Episode.failed``) is reported (``env/failed_episodes``)
  and not trained on: its truncated reward says nothing about the policy, so it is left out of the batch and of
  its task group's advantage baseline (spec §6 groups the episodes that were played; a failed episode is
  reported, never silently dropped). It counts as not won in ``rollout/success`` and ``eval/success``. A step
  whose every episode failed makes no update (``optim/steps`` 0).
* Micro-batches hold whole trajectories (all per-turn rows of an episode together) so that, when the proximal
  pass is skipped, each micro-batch's correction sees the full history of its states; the correction metrics
  are recomputed on the whole batch afterwards (no forward pass).
* Held-out evaluation samples from the arm's executor (the deployed behaviour policy) at
  ``train.eval_temperature``, with fixed seeds shared by all arms and steps.
* The learner keeps fp32 master weights; the ``bf16`` arm's executor is a bf16 copy (CPU-scale stand-in for a
  bf16 serving engine); the learner forward runs in ``model.dtype``.
* No KL penalty, no entropy bonus, no reference model (as verl-agent's GiGPO recipe with kl_coef 0).
"""

from __future__ import annotations

import contextlib
import math
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from interq.agent.loop import Episode, PooledEnvs, play_episodes
from interq.train.config import (LEARNER_ATTENTIONS, LEARNER_AUTOCASTS, LEARNER_GEMMS, AlgoConfig, NonFiniteTrainingError,
                                 RunConfig, resolve_learner_attention, resolve_learner_autocast)

# ---------------------------------------------------------------------------------------------- advantages


def turn_advantages(episodes: list[Episode], cfg: AlgoConfig) -> tuple[list[list[float]], dict, torch.Tensor]:
    """Spec §6 advantages per (episode, turn): GRPO broadcasts A_E; GiGPO gives A_E + omega * A_S per step."""
    from interq.algo.advantages import gigpo_advantages, grpo_advantages

    returns = torch.tensor([ep.episode_return for ep in episodes], dtype=torch.float64)  # [N]
    a_ep, metrics = grpo_advantages(returns, [ep.group for ep in episodes], use_std=cfg.grpo_std)  # [N]
    out = [[float(a_ep[i])] * ep.num_turns for i, ep in enumerate(episodes)]
    if cfg.advantage == "gigpo":
        steps = [(i, t) for i, ep in enumerate(episodes) for t in range(ep.num_turns)]
        if steps:
            adv, m = gigpo_advantages(
                torch.tensor([episodes[i].rewards[t] for i, t in steps], dtype=torch.float64),  # [M]
                [i for i, _ in steps], torch.tensor([t for _, t in steps]),
                [episodes[i].group for i, _ in steps], [episodes[i].anchors[t] for i, t in steps],
                gamma=cfg.gigpo_gamma, omega=cfg.gigpo_omega, use_std=cfg.grpo_std)  # [M]
            for (i, t), v in zip(steps, adv.tolist()):
                out[i][t] = v
            metrics.update(m)
    return out, {"adv/episode_mean_abs": float(a_ep.abs().mean()) if len(a_ep) else 0.0, **metrics}, a_ep


# ---------------------------------------------------------------------------------------------- batch


@dataclass
class Batch:
    """The step's rows, right-padded. Every tensor is [B, L] unless noted."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    action_mask: torch.Tensor          # bool
    behavior_logprobs: torch.Tensor
    advantages: torch.Tensor           # 0 off action tokens
    traj_id: torch.Tensor | None       # [B] per_turn layout only
    turn_idx: torch.Tensor | None      # [B] per_turn layout only
    row_episode: list[int]             # [B] episode index of each row
    temperature: float
    top_p: float
    metrics: dict                      # advantage metrics


def build_batch(episodes: list[Episode], cfg: AlgoConfig, pad_id: int) -> Batch:
    """The step's rows with per-token advantages (spec §5, §6).

    Only actions the environment received are trained (spec §5): an action cut by the context limit while it
    was being generated (turn index >= ``ep.num_turns``, concatenated layout; the per-turn layout never keeps
    its row) is taken off the action mask and gets advantage 0, so both layouts train the same tokens.
    """
    from interq.rollout import collate_trajectories

    a_turn, adv_metrics, _ = turn_advantages(episodes, cfg)
    rows, row_ep, row_turn = [], [], []
    for i, ep in enumerate(episodes):
        for t, traj in enumerate(ep.rows):
            rows.append(traj)
            row_ep.append(i)
            row_turn.append(t)
    coll = collate_trajectories(rows, pad_token_id=pad_id)
    action_mask = coll["action_mask"].clone()  # [B, L] bool
    adv = torch.zeros(coll["input_ids"].shape, dtype=torch.float32)  # [B, L]
    for b, (i, t0) in enumerate(zip(row_ep, row_turn)):
        turn = coll["turn_index"][b] if cfg.layout == "concatenated" else torch.full_like(coll["turn_index"][b], t0)  # [L]
        received = (turn >= 0) & (turn < episodes[i].num_turns)  # [L] turns whose action reached the environment
        action_mask[b] &= received
        steps = torch.tensor(a_turn[i] + [0.0], dtype=torch.float32)  # [T+1]; the extra entry is never used
        per_tok = steps[turn.clamp(0, len(steps) - 1)]  # [L]
        adv[b] = torch.where(action_mask[b], per_tok, torch.zeros_like(per_tok))
    per_turn = cfg.layout == "per_turn"
    return Batch(coll["input_ids"], coll["attention_mask"], action_mask, coll["behavior_logprobs"], adv,
                 torch.tensor(row_ep) if per_turn else None, torch.tensor(row_turn) if per_turn else None,
                 row_ep, rows[0].sampling.temperature, rows[0].sampling.top_p, adv_metrics)


# A forward's rows are cut into length buckets: a row joins the bucket of the longer rows before it while its length
# is at least this share of the bucket's width (right padding past it is computed and thrown away).
BUCKET_FILL = 0.8


def row_keys(input_ids: torch.Tensor, action_mask: torch.Tensor, attention_mask: torch.Tensor) -> list[bytes]:
    """One key per right-padded row [B, L]: its tokens and its scored (action) positions. Rows with the same key have
    the same learner log-probs, so a forward computes each distinct one once (a group's episodes often repeat each
    other's turns)."""
    lengths = attention_mask.sum(-1).tolist()  # [B]
    ids, act = input_ids.numpy(), action_mask.numpy()
    return [ids[r, :n].tobytes() + act[r, :n].tobytes() for r, n in enumerate(lengths)]


def length_buckets(lengths: list[int], fill: float = BUCKET_FILL) -> list[int]:
    """Sizes of the buckets that ``lengths`` (sorted longest first) are cut into: a bucket takes the next row while
    that row is at least ``fill`` x the bucket's first (longest) row."""
    sizes: list[int] = []
    width = None
    for n in lengths:
        if width is None or n < fill * width:
            sizes.append(0)
            width = n
        sizes[-1] += 1
    return sizes


def forward_tokens(lengths: list[int], fill: float = BUCKET_FILL) -> int:
    """Padded tokens the bucketed forward over rows of ``lengths`` (distinct rows, any order) computes."""
    ordered = sorted(lengths, reverse=True)
    total, start = 0, 0
    for size in length_buckets(ordered, fill):
        total += size * ordered[start]
        start += size
    return total


def micro_batches(batch: Batch, row_subset: list[int], tokens_per_microbatch: int) -> list[list[int]]:
    """Pack rows (whole episodes together, in order: the correction and the sequence mean need an episode's rows
    together) so that the forward of each pack, over its distinct rows in length buckets
    (:func:`forward_tokens`), computes at most ``tokens_per_microbatch`` padded tokens (one episode over it: alone)."""
    lengths = batch.attention_mask.sum(-1).tolist()  # [B]
    keys = row_keys(batch.input_ids, batch.action_mask, batch.attention_mask)
    by_ep: dict[int, list[int]] = {}
    for r in row_subset:
        by_ep.setdefault(batch.row_episode[r], []).append(r)
    out: list[list[int]] = []
    cur: list[int] = []
    seen: dict[bytes, int] = {}  # distinct rows of the current pack -> length
    for rows in by_ep.values():
        new = {keys[r]: lengths[r] for r in rows if keys[r] not in seen}
        if cur and forward_tokens([*seen.values(), *new.values()]) > tokens_per_microbatch:
            out.append(cur)
            cur, seen, new = [], {}, {keys[r]: lengths[r] for r in rows}
        cur += rows
        seen.update(new)
    if cur:
        out.append(cur)
    return out


def _rows(batch: Batch, rows: list[int]) -> dict:
    width = int(batch.attention_mask[rows].sum(-1).max())
    idx = torch.tensor(rows)
    sl = lambda x: x[idx, :width]  # noqa: E731
    return {"input_ids": sl(batch.input_ids), "attention_mask": sl(batch.attention_mask),
            "action_mask": sl(batch.action_mask), "behavior": sl(batch.behavior_logprobs),
            "advantages": sl(batch.advantages),
            "traj_id": batch.traj_id[idx] if batch.traj_id is not None else None,
            "turn_idx": batch.turn_idx[idx] if batch.turn_idx is not None else None, "width": width, "idx": idx}


# ---------------------------------------------------------------------------------------------- learner


class Learner:
    """The learner model with its optimizer, the aligned-forward switch and a forward counter."""

    def __init__(self, model: torch.nn.Module, cfg: RunConfig, qcfg=None) -> None:
        self.model, self.cfg, self.qcfg = model, cfg, qcfg
        o = cfg.optim
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=o.lr, betas=(o.beta1, o.beta2), weight_decay=o.weight_decay)
        self.forward_calls = 0  # learner forwards (a micro-batch's length buckets: one each)
        self.forward_rows = 0   # rows those forwards computed (each distinct row of a micro-batch once)
        model.register_forward_hook(self._count, with_kwargs=True)
        if cfg.train.gradient_checkpointing:
            # each decoder layer's activations are recomputed in the backward (non-reentrant: the recomputation runs
            # the same patched modules, so it must happen inside the forward's context: see update())
            enable_activation_checkpointing(model)

    def _count(self, module, args, kwargs, output):
        ids = kwargs.get("input_ids", args[0] if args else None)
        self.forward_calls += 1
        self.forward_rows += int(ids.shape[0]) if ids is not None else 0

    def context(self):
        """The learner's forward context (aligned forward, autocast): :func:`learner_context`."""
        t = self.cfg.train
        return learner_context(self.model, self.cfg.algo.align, self.qcfg, t.learner_autocast, t.learner_gemm,
                               t.learner_attention)

    def logprobs(self, mb: dict, batch: "Batch", entered: bool = False) -> torch.Tensor:
        """Learner log-probs of the rows under the executor's sampling transform. [b, l]
        ``entered``: the caller is inside :meth:`context` already (the training forward, whose backward runs there)."""
        if entered:
            return _sequence_logprobs(self.model, mb, batch)
        t = self.cfg.train
        return learner_logprobs(self.model, mb, batch, self.cfg.algo.align, self.qcfg, t.learner_autocast, t.learner_gemm,
                                t.learner_attention)


def enable_activation_checkpointing(model: torch.nn.Module, enable: bool = True) -> None:
    """transformers' activation (gradient) checkpointing of every decoder layer, non-reentrant (torch then checks
    that the recomputation saves what the forward saved: a backward outside the forward's aligned context raises
    ``CheckpointError`` instead of computing another gradient)."""
    on = getattr(model, "activation_checkpointing_enable", None)  # newer transformers; older ones: gradient_checkpointing_*
    if enable:
        if on is not None:
            on(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    else:
        (getattr(model, "activation_checkpointing_disable", None) or model.gradient_checkpointing_disable)()


@contextlib.contextmanager
def learner_context(model: torch.nn.Module, align: bool, qcfg=None, autocast: str = "off", gemm: str = "torch",
                    attention: str = "sdpa"):
    """Where the learner's forward runs: the aligned (quantized-like) forward when ``align``; under
    ``torch.autocast(bf16)`` when ``autocast='bf16'``, with bf16 backward GEMMs of the linear layers when
    ``autocast='bf16_backward'`` (``train.learner_autocast``; log-probs and gradients stay fp32; ``auto`` resolved
    by the model's device, :func:`interq.train.config.resolve_learner_autocast`); the fp32 GEMMs
    through oneDNN when ``gemm='onednn'`` (``train.learner_gemm``, :mod:`interq.train.onednn_gemm`); the causal
    self-attention by interq's CPU kernel when ``attention='kernel'`` (``train.learner_attention``, ``auto`` resolved
    by the model's device, :mod:`interq.train.learner_attention`).
    The training step also runs its backward here, so that gradient checkpointing recomputes the same forward."""
    if autocast not in LEARNER_AUTOCASTS:
        raise ValueError(f"train.learner_autocast={autocast!r} is not accepted; choose one of {list(LEARNER_AUTOCASTS)}")
    if gemm not in LEARNER_GEMMS:
        raise ValueError(f"train.learner_gemm={gemm!r} is not accepted; choose one of {list(LEARNER_GEMMS)}")
    if attention not in LEARNER_ATTENTIONS:
        raise ValueError(f"train.learner_attention={attention!r} is not accepted; choose one of {list(LEARNER_ATTENTIONS)}")
    if align:
        from interq.quant import aligned

        ctx = aligned(model, qcfg)
    else:
        ctx = contextlib.nullcontext()
    dev = next(model.parameters()).device
    autocast = resolve_learner_autocast(autocast, dev.type)  # auto: by the model's device
    if autocast == "bf16":
        cast = torch.autocast(dev.type, dtype=torch.bfloat16)
    elif autocast == "bf16_backward":
        from interq.train.bf16_backward import bf16_backward

        cast = bf16_backward()
    else:
        cast = contextlib.nullcontext()
    if gemm == "onednn":
        from interq.train.onednn_gemm import onednn_gemm

        lib = onednn_gemm()
    else:
        lib = contextlib.nullcontext()
    from interq.train.learner_attention import learner_attention

    att = learner_attention(model, resolve_learner_attention(attention, dev.type))
    with att, lib, cast, ctx:  # oneDNN's F.linear outside bf16_backward's, whose forward then runs it
        yield


def _sequence_logprobs(model: torch.nn.Module, mb: dict, batch: Batch) -> torch.Tensor:
    """Log-probs of a micro-batch's rows [b, width]: each distinct row (:func:`row_keys`) computed once, the rows
    sorted by length and cut into buckets (:func:`length_buckets`), one forward each. The same values as one
    forward over the padded rows, up to the summation order of other GEMM shapes; a repeated row's gradient is the
    sum of its copies' (the index below)."""
    from interq.rollout import sequence_logprobs

    dev = next(model.parameters()).device  # train.device: the batch stays on the CPU, the forward runs there
    ids, mask, act = mb["input_ids"], mb["attention_mask"], mb["action_mask"]  # [b, width]
    lengths = mask.sum(-1).tolist()
    distinct: dict[bytes, int] = {}  # key -> position among the distinct rows
    reps: list[int] = []  # the first row of each distinct one
    which = []  # [b] each row's distinct one
    for r, key in enumerate(row_keys(ids, act, mask)):
        if key not in distinct:
            distinct[key] = len(reps)
            reps.append(r)
        which.append(distinct[key])
    order = sorted(range(len(reps)), key=lambda i: -lengths[reps[i]])  # distinct rows, longest first
    width = ids.shape[1]
    pieces, start = [], 0
    for size in length_buckets([lengths[reps[i]] for i in order]):
        rows = torch.tensor([reps[i] for i in order[start:start + size]])
        w = lengths[int(rows[0])]
        # only action tokens are used (correction, loss, metrics): project to the vocabulary only there
        out = sequence_logprobs(model, ids[rows, :w].to(dev), mask[rows, :w].to(dev), temperature=batch.temperature,
                                top_p=batch.top_p, score_mask=act[rows, :w].to(dev))  # [size, w]
        pieces.append(torch.nn.functional.pad(out, (0, width - w)))  # [size, width], 0 past each row
        start += size
    position = [0] * len(reps)
    for k, i in enumerate(order):
        position[i] = k
    computed = torch.cat(pieces)  # [u, width] in ``order``
    return computed[torch.tensor([position[i] for i in which], device=computed.device)].to(ids.device)  # [b, width]


def learner_logprobs(model: torch.nn.Module, mb: dict, batch: Batch, align: bool, qcfg=None,
                     autocast: str = "off", gemm: str = "torch", attention: str = "sdpa") -> torch.Tensor:
    """Log-probs of a micro-batch's rows (``_rows``) under the executor's sampling transform, inside
    :func:`learner_context`. [b, l]"""
    with learner_context(model, align, qcfg, autocast, gemm, attention):
        return _sequence_logprobs(model, mb, batch)


def proximal_logprobs(model: torch.nn.Module, batch: Batch, tokens_per_microbatch: int, align: bool,
                      qcfg=None, autocast: str = "off", gemm: str = "torch", attention: str = "sdpa") -> torch.Tensor:
    """Step 4, the proximal pass: the learner's no-grad forward over the whole batch, micro-batch by
    micro-batch (also ``interq mismatch``'s learner pass). [B, L], 0 off the rows' tokens."""
    proximal = torch.zeros_like(batch.behavior_logprobs)  # [B, L]
    model.eval()
    with torch.no_grad():
        for rows in micro_batches(batch, list(range(batch.input_ids.shape[0])), tokens_per_microbatch):
            mb = _rows(batch, rows)
            proximal[mb["idx"], : mb["width"]] = learner_logprobs(model, mb, batch, align, qcfg, autocast, gemm,
                                                                         attention)
    return proximal


def correction_config(a: AlgoConfig):
    from interq.algo.corrections import CorrectionConfig

    return CorrectionConfig(budget=a.budget, tis_cap=a.tis_cap, icepop_bounds=(a.icepop_low, a.icepop_high),
                            geo_bounds=(a.geo_low, a.geo_high), prefix_cap=a.prefix_cap, normalize=a.normalize,
                            token_correction=a.token_correction)


def skips_proximal_pass(a: AlgoConfig) -> bool:
    """The proximal pass equals the current forward and its keep-mask is known up front (see docstring)."""
    return a.ppo_epochs == 1 and a.minibatches_per_step == 1 and a.correction not in ("icepop", "geo_mask") and not a.normalize


def update(learner: Learner, batch: Batch, cfg: RunConfig, step: int = 0) -> dict:
    """Steps 4-6: proximal pass (or not), correction, decoupled PPO with gradient accumulation."""
    from interq.algo.corrections import compute_correction
    from interq.algo.loss import ppo_loss

    a, t = cfg.algo, cfg.train
    ccfg = correction_config(a)
    model = learner.model
    calls0, rows0 = learner.forward_calls, learner.forward_rows
    scored = 0  # rows whose log-probs the learner's passes gave: / batch rows = passes over the batch
    all_rows = list(range(batch.input_ids.shape[0]))
    proximal = torch.zeros_like(batch.behavior_logprobs)  # [B, L]
    skip = skips_proximal_pass(a)
    weights = keep = None
    if not skip:
        proximal = proximal_logprobs(model, batch, t.tokens_per_microbatch, a.align, learner.qcfg,
                                     t.learner_autocast, t.learner_gemm, t.learner_attention)  # [B, L]
        scored += len(all_rows)
        corr = compute_correction(a.correction, proximal, batch.behavior_logprobs, batch.action_mask,
                                  traj_id=batch.traj_id, turn_idx=batch.turn_idx, config=ccfg)
        weights, keep = corr.weights, corr.keep_mask  # [B, L]
    model.train()
    episodes = sorted(set(batch.row_episode))
    rng = random.Random(t.seed * 7919 + step)  # mini-batch shuffles of epochs > 0
    stats = {"loss/policy": 0.0, "loss/clip_frac": 0.0, "optim/grad_norm": 0.0, "optim/steps": 0, "optim/nonfinite_steps": 0}
    n_tok = 0
    for epoch in range(a.ppo_epochs):
        order = episodes[:] if epoch == 0 else rng.sample(episodes, len(episodes))
        chunks = [order[k:: a.minibatches_per_step] for k in range(a.minibatches_per_step)]
        for chunk in chunks:
            ep_set = set(chunk)
            rows_mb = [r for r in all_rows if batch.row_episode[r] in ep_set]
            finite = batch.action_mask[rows_mb] & torch.isfinite(batch.behavior_logprobs[rows_mb])  # [b, L]
            kept = finite if skip else keep[rows_mb]  # [b, L] (skip: keep-mask = finite action tokens)
            total_tokens = int(kept.sum())
            total_seqs = len({batch.row_episode[r] for r, any_kept in zip(rows_mb, kept.any(-1).tolist()) if any_kept})
            learner.optimizer.zero_grad(set_to_none=True)
            mb_loss = 0.0
            kept_tokens, kept_seqs = 0, set()  # what the correction really kept (skip: known only after the forward)
            for rows in micro_batches(batch, rows_mb, t.tokens_per_microbatch):
                mb = _rows(batch, rows)
                scored += len(rows)
                with learner.context():  # the backward too: gradient checkpointing recomputes this forward
                    current = learner.logprobs(mb, batch, entered=True)  # [b, l]
                    if skip:
                        prox = current.detach()  # [b, l]
                        proximal[mb["idx"], : mb["width"]] = prox
                        c = compute_correction(a.correction, prox, mb["behavior"], mb["action_mask"],
                                               traj_id=mb["traj_id"], turn_idx=mb["turn_idx"], config=ccfg)
                        w, k = c.weights, c.keep_mask  # [b, l]
                    else:
                        prox = proximal[mb["idx"], : mb["width"]]
                        w, k = weights[mb["idx"], : mb["width"]], keep[mb["idx"], : mb["width"]]
                    loss, m = ppo_loss(current, prox, mb["advantages"], w, k, eps_low=a.clip_eps_low,
                                       eps_high=a.clip_eps_high, aggregation=a.loss_agg, num_tokens=total_tokens,
                                       num_seqs=total_seqs, seq_ids=mb["traj_id"])
                    loss.backward()
                nk = int(k.sum())
                stats["loss/clip_frac"] += m["ppo/clip_frac"] * nk
                mb_loss += float(loss.detach())
                n_tok += nk
                if skip:
                    kept_tokens += nk
                    kept_seqs.update(batch.row_episode[r] for r, any_kept in zip(mb["idx"].tolist(), k.any(-1).tolist())
                                     if any_kept)
            if skip:
                # the denominators were counted before the forward, from the behavior log-probs; a learner log-prob
                # that is not finite (top_p < 1 excluding the sampled token, an overflow) drops its token as well:
                # rescale so the loss is still a mean over the tokens (sequences) actually kept
                real = kept_tokens if a.loss_agg == "token_mean" else len(kept_seqs)
                counted = total_tokens if a.loss_agg == "token_mean" else total_seqs
                if real != counted and real > 0:
                    for prm in model.parameters():
                        if prm.grad is not None:
                            prm.grad.mul_(counted / real)
                    mb_loss *= counted / real
            gn = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip if cfg.optim.grad_clip > 0 else math.inf)
            stats["loss/policy"] += mb_loss
            if not (math.isfinite(mb_loss) and math.isfinite(float(gn))):
                # a non-finite loss or gradient never reaches the weights (nor, through the sync, the executor)
                learner.optimizer.zero_grad(set_to_none=True)
                stats["optim/nonfinite_steps"] += 1
                continue
            learner.optimizer.step()
            stats["optim/grad_norm"] += float(gn)
            stats["optim/steps"] += 1
    model.eval()
    # the §7 metrics on the whole batch (pure function of log-probs already computed: no forward pass)
    corr = compute_correction(a.correction, proximal, batch.behavior_logprobs, batch.action_mask,
                              traj_id=batch.traj_id, turn_idx=batch.turn_idx, config=ccfg)
    n_opt = max(stats["optim/steps"], 1)
    calls = learner.forward_calls - calls0
    n_mb = len(micro_batches(batch, all_rows, t.tokens_per_microbatch))
    passes = scored / max(len(all_rows), 1)
    out = {**corr.metrics, **batch.metrics, "loss/policy": stats["loss/policy"] / n_opt, "loss/clip_frac": stats["loss/clip_frac"] / max(n_tok, 1),
           "optim/grad_norm": stats["optim/grad_norm"] / n_opt, "optim/steps": stats["optim/steps"],
           "optim/nonfinite_steps": stats["optim/nonfinite_steps"],
           "learner/forward_calls": calls, "learner/forward_passes": passes,
           "learner/distinct_row_frac": (learner.forward_rows - rows0) / max(scored, 1),
           "learner/proximal_pass_skipped": skip, "learner/microbatches": n_mb}
    return out


# ---------------------------------------------------------------------------------------------- rollout / eval


def sampling_params(cfg: RunConfig, fmt, temperature: float | None = None):
    from interq.rollout import SamplingParams

    r = cfg.rollout
    return SamplingParams(temperature=r.temperature if temperature is None else temperature, top_p=r.top_p,
                          max_action_tokens=r.max_action_tokens, stop_token_ids=tuple(fmt.stop_token_ids))


def rollout(engine, fmt, make_env, tasks, seeds, groups, sampling, cfg: RunConfig, envs=None) -> list[Episode]:
    """Play the episodes (``envs``: where the environments run, :func:`interq.train.build.env_runner`; default
    in-process ``make_env()`` per episode)."""
    from interq.train.build import agent_render
    from interq.train.config import resolve_auto

    by_index = resolve_auto(cfg).env.action_format == "index"
    return play_episodes(engine, fmt, make_env, tasks, seeds, groups, sampling, max_turns=cfg.env.max_turns,
                         invalid_action_penalty=cfg.env.invalid_action_penalty, layout=cfg.algo.layout,
                         history_turns=cfg.rollout.history_turns, render=agent_render(cfg),
                         action_by_index=by_index, envs=envs,
                         overlap=cfg.env.overlap and isinstance(envs, PooledEnvs))


def episode_stats(episodes: list[Episode], prefix: str) -> dict:
    n = max(len(episodes), 1)
    out = {f"{prefix}/success": sum(ep.won for ep in episodes) / n,
           f"{prefix}/return": sum(ep.episode_return for ep in episodes) / n,
           f"{prefix}/length": sum(ep.num_turns for ep in episodes) / n,
           f"{prefix}/invalid_frac": sum(1 - v for ep in episodes for v in ep.valid) / max(sum(ep.num_turns for ep in episodes), 1),
           f"{prefix}/context_truncated_frac": sum(ep.context_truncated for ep in episodes) / n}
    failed = sum(bool(ep.failed) for ep in episodes)
    if failed:  # only with worker processes (env.num_workers); "env/failed_episodes" is always logged by train()
        out[f"{prefix}/failed_episodes"] = failed
    return out


def evaluate(engine, fmt, make_env, tasks, cfg: RunConfig, envs=None) -> dict:
    """Held-out success, return and length: fixed seeds shared by all arms and steps."""
    if not tasks:
        return {}
    k = cfg.train.eval_episodes_per_task
    ts = [t for t in tasks for _ in range(k)]
    seeds = [10_000_019 + i for i in range(len(ts))]
    eps = rollout(engine, fmt, make_env, ts, seeds, list(range(len(ts))),
                  sampling_params(cfg, fmt, cfg.train.eval_temperature), cfg, envs)
    # per-episode outcomes in task order ("0"/"1"): arms share tasks and seeds, so they can be compared paired
    return {**episode_stats(eps, "eval"), "eval/outcomes": "".join("1" if ep.won else "0" for ep in eps)}


def step_tasks(train_tasks, cfg: RunConfig, step: int):
    """The step's task instances and seeds: a pure function of (seed, step), so a resumed run replays them."""
    t = cfg.train
    rng = random.Random(t.seed * 1_000_003 + step)
    chosen = rng.sample(train_tasks, min(t.tasks_per_step, len(train_tasks)))
    tasks = [task for task in chosen for _ in range(t.episodes_per_task)]
    groups = [g for g in range(len(chosen)) for _ in range(t.episodes_per_task)]
    seeds = [(t.seed * 1_000_003 + step) * 4096 + i for i in range(len(tasks))]
    return tasks, seeds, groups


# ---------------------------------------------------------------------------------------------- the loop


def _finished_records(run_dir: Path, t) -> list[dict] | None:
    """The run's step records when they are exactly those of a finished run (step 0 when evaluated, then 1 ..
    ``train.steps``, each once), else None."""
    from interq.train.logging import read_jsonl

    records = read_jsonl(run_dir / "metrics.jsonl")
    expected = ([0] if t.eval_every_steps else []) + list(range(1, t.steps + 1))
    return records if [r.get("step") for r in records] == expected else None


MACHINE_LOG = "machine.jsonl"


def _record_machine(run_dir: Path, start: int, device: torch.device) -> None:
    """Append to the run's ``machine.jsonl`` where this (re)start of training runs: ``start_step`` (the checkpoint
    it resumes from, 0 for the start: it makes the steps after it), the UTC time and :func:`interq.machine.host_info`.
    Lines of an earlier attempt whose steps were dropped (``start_step`` >= ``start``) go, as their records in
    ``metrics.jsonl`` do, so each line covers the steps up to the next line's ``start_step``."""
    from datetime import datetime, timezone

    from interq.machine import host_info
    from interq.train.logging import scan_jsonl, write_records

    path = run_dir / MACHINE_LOG
    kept = [r for r in scan_jsonl(path)[0] if isinstance(r.get("start_step"), int) and r["start_step"] < start]
    now = datetime.now(timezone.utc).isoformat(timespec="seconds")
    write_records(path, kept + [{"start_step": start, "time": now, **host_info(device)}])


def train(cfg: RunConfig, run_dir: str | Path, model, tokenizer, make_env, train_tasks, eval_tasks,
          *, resume: bool = True, start_policy: dict | None = None) -> list[dict]:
    """Run ``cfg.train.steps`` RL steps from the given (warm-started) policy; returns the step records.

    A run already in ``run_dir`` is resumed from its last checkpoint only when it was made from ``start_policy``
    with the same resolved config and numerics (``train.steps`` may grow; :mod:`interq.train.provenance`), else
    :class:`~interq.train.provenance.StaleResultError` before anything in ``run_dir`` is touched.
    """
    from interq.rollout import RolloutEngine
    from interq.train.build import build_executor, chat_format, env_runner
    from interq.rundir import command_line
    from interq.train.checkpoint import check_resumable, discard_checkpoints, resume_run, save_checkpoint
    from interq.train.logging import RunLogger, read_jsonl
    from interq.train.provenance import StaleResultError, run_differences, stale_message, write_run_record

    run_dir = Path(run_dir)
    differences = run_differences(cfg, run_dir, start_policy)
    if differences:
        raise StaleResultError(stale_message([(run_dir, differences)]))
    if resume:  # a record that resuming would leave out: refused before anything here changes
        check_resumable(run_dir, 0 if cfg.train.eval_every_steps else 1, f"{command_line()} --no-resume")
    run_dir.mkdir(parents=True, exist_ok=True)
    write_run_record(cfg, run_dir, start_policy)
    t = cfg.train
    if t.threads:
        torch.set_num_threads(t.threads)
    from interq.machine import resolve_device

    device = resolve_device(t.device, "train.device")
    model.to(device)  # before the executor (a copy of it) and the optimizer
    fmt = chat_format(tokenizer)
    executor = build_executor(model, cfg.rollout)
    learner = Learner(model, cfg, executor.qcfg)
    start = 0
    # the newest complete checkpoint whose every earlier step has its record (else an older one, or a refusal)
    ck = resume_run(run_dir, model, learner.optimizer, 0 if t.eval_every_steps else 1,
                    f"{command_line()} --no-resume") if resume else None
    if ck is not None:
        start = ck["step"]
        executor.sync(model)
    else:
        finished = _finished_records(run_dir, t) if resume and not (run_dir / "checkpoints").exists() else None
        if finished is not None:  # e.g. a study's records kept in git without their checkpoints: nothing to run
            print(f"[resume] {run_dir}: its records reach train.steps={t.steps} and it keeps no checkpoint: "
                  "finished, reused as it is", file=sys.stderr)
            return finished
        discard_checkpoints(run_dir)  # started over: no checkpoint of an earlier attempt can be resumed later
    logger = RunLogger(run_dir, progress_total=t.steps, progress=t.progress, tensorboard=t.tensorboard,
                       desc=cfg.name, start=start)
    logger.truncate_after(start if start else -1)  # from scratch: no record of an earlier attempt survives
    _record_machine(run_dir, start, device)
    engine = RolloutEngine(executor.module, cache_factory=executor.cache_factory, pad_token_id=fmt.pad_token_id,
                           max_context_tokens=cfg.rollout.max_context_tokens, info=executor.info)
    envs = env_runner(cfg.env, make_env)  # in-process, or the worker pool of env.num_workers (closed below)
    bad_in_a_row = 0  # consecutive steps whose every optimizer step was skipped (non-finite loss or gradient)
    try:
        if start == 0 and t.eval_every_steps:
            t0 = time.perf_counter()
            logger.log({"step": 0, **evaluate(engine, fmt, make_env, eval_tasks, cfg, envs),
                        "time/eval": time.perf_counter() - t0})
        for step in range(start + 1, t.steps + 1):
            rec: dict = {"step": step}
            t0, c0 = time.perf_counter(), time.process_time()
            env_s0, restarts0 = envs.seconds, _restarts(envs)
            tasks, seeds, groups = step_tasks(train_tasks, cfg, step)
            episodes = rollout(engine, fmt, make_env, tasks, seeds, groups, sampling_params(cfg, fmt), cfg, envs)
            trained = [ep for ep in episodes if not ep.failed]  # a failed worker's episode is not trained on
            env_s = envs.seconds - env_s0
            t1, c1 = time.perf_counter(), time.process_time()
            if trained:
                batch = build_batch(trained, cfg.algo, fmt.pad_token_id)
                rec.update(update(learner, batch, cfg, step))
                batch_rec = {"batch/rows": int(batch.input_ids.shape[0]), "batch/action_tokens": int(batch.action_mask.sum()),
                             "batch/tokens": int(batch.attention_mask.sum())}
            else:
                rec.update({"optim/steps": 0, "optim/nonfinite_steps": 0})
                batch_rec = {"batch/rows": 0, "batch/action_tokens": 0, "batch/tokens": 0}
            bad_in_a_row = bad_in_a_row + 1 if rec["optim/nonfinite_steps"] and not rec["optim/steps"] else 0
            t2, c2 = time.perf_counter(), time.process_time()
            sync_s = executor.sync(model)
            t3 = time.perf_counter()
            rec.update(episode_stats(episodes, "rollout"))
            # wall seconds, and CPU seconds of this process (all its threads; not env workers): on a shared machine
            # the CPU seconds compare runs, the wall seconds depend on the load
            rec.update({"time/rollout": t1 - t0, "time/learner": t2 - t1, "time/sync": t3 - t2, "sync/seconds": sync_s,
                        "time/rollout_cpu": c1 - c0, "time/learner_cpu": c2 - c1,
                        "time/env": env_s, "env/failed_episodes": len(episodes) - len(trained),
                        "env/worker_restarts": _restarts(envs) - restarts0, **batch_rec})
            if t.eval_every_steps and (step % t.eval_every_steps == 0 or step == t.steps):
                te = time.perf_counter()
                rec.update(evaluate(engine, fmt, make_env, eval_tasks, cfg, envs))
                rec["time/eval"] = time.perf_counter() - te
            logger.log(rec)
            if not math.isfinite(rec.get("loss/policy", 0.0)):  # the forward itself: no later step can be better
                raise NonFiniteTrainingError(
                    f"{run_dir}: stopped at step {step}: its policy loss is {rec['loss/policy']} (a non-finite forward: "
                    "the weights, the batch's log-probs or the learning rate); its non-finite updates were skipped, "
                    "its record is the last in metrics.jsonl, and no checkpoint was written after the previous one")
            if bad_in_a_row >= cfg.optim.max_nonfinite_steps:
                raise NonFiniteTrainingError(
                    f"{run_dir}: {bad_in_a_row} steps in a row (to step {step}) had a non-finite loss or gradient; their "
                    f"updates were skipped, so the weights (and the executor) are those of step {step - bad_in_a_row}; "
                    f"see optim/nonfinite_steps in metrics.jsonl (limit: optim.max_nonfinite_steps)")
            if t.checkpoint_every_steps and (step % t.checkpoint_every_steps == 0 or step == t.steps):
                save_checkpoint(run_dir, step, model, tokenizer, learner.optimizer, cfg)
    finally:
        logger.close()
        if getattr(envs, "pool", None) is not None:
            envs.pool.close()
    return read_jsonl(run_dir / "metrics.jsonl")


def _restarts(envs) -> int:
    """Worker processes the pool has replaced so far (0 in-process)."""
    pool = getattr(envs, "pool", None)
    return sum(pool.restarts) if pool is not None else 0
