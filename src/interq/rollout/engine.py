"""Batched multi-turn generation that keeps each episode's KV cache across turns.

Small separable pieces:

* :func:`forward_step` - one forward of new tokens into the cache (prefill of an observation chunk, or the
  decode of one token: the same call), returning fp32 logits at the last column;
* :func:`interq.rollout.sampling.sample_tokens` - the sampling transform and the seeded draw;
* the cache - any transformers ``Cache`` built by ``cache_factory(model_config)`` (default a ``DynamicCache``
  appending in place, :func:`dynamic_cache_factory`; the quantized executor passes its KV8 cache), used only
  through ``update`` (inside the model), ``get_seq_length`` and ``batch_select_indices``;
* :class:`EpisodeBatch` - the bookkeeping: which rows of the cache belong to which episode, the attention mask
  over cache columns, the per-episode position ids and records. It knows token ids only, no prompts.

Layout. All live episodes share one batched cache. Each forward appends the same number of columns to every
row; a row with fewer real tokens in that forward gets masked padding columns (left-padded within a prefill
chunk, so the last column is always real for the rows that sample). The attention mask covers every cache
column; position ids count only the row's real tokens, so an episode sees exactly the positions it would see
alone (batched == one-by-one). The last sampled token of a turn is fed at the start of the next turn's prefill.
When episodes leave the batch their rows are dropped from the cache, and cache columns that no remaining row
attends to are dropped too (for ``DynamicLayer`` storage and subclasses).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import torch
from transformers.cache_utils import Cache, DynamicLayer

from interq._hf import cache_kwarg
from interq.quant.kv_buffer import growing_dynamic_cache
from interq.rollout.sampling import SamplingParams, sample_tokens
from interq.rollout.trajectory import Trajectory, TurnSpan

CacheFactory = Callable[[Any], Cache]


def dynamic_cache_factory(model_config: Any) -> Cache:
    """The default cache: a transformers ``DynamicCache`` whose layers append in place into spare capacity instead
    of concatenating the whole cache at every step (:mod:`interq.quant.kv_buffer`; the same values).

    Measured 2026-12-01 and not kept then: views of a larger buffer made torch's CPU flash kernel several times
    slower through transformers' unpacked decode path. With the packed decode attention (``sdpa_packed``, the
    rollout's default since NUMERICS_VERSION 2) attention runs as fast on the views and gives the same bits (an AMD EPYC Zen 5,
    2026-12-02).
    """
    return growing_dynamic_cache(model_config)


def forward_step(
    model: torch.nn.Module,
    cache: Cache,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
) -> torch.Tensor:
    """Run ``input_ids`` [R, n] through ``model``, writing their K/V into ``cache``. -> fp32 logits [R, V] of the
    last column. ``attention_mask`` [R, K + n] covers the cache columns plus the new ones; ``position_ids`` [R, n].

    The cache goes under the name the model's forward takes (``cache`` or, in earlier transformers 5.x releases,
    ``past_key_values``: :mod:`interq._hf`); a forward that did not write the ``n`` new columns into it raises
    instead of sampling from a context the model never saw.
    """
    name, before = cache_kwarg(model), cache.get_seq_length()
    n = input_ids.shape[1]
    # The last column as an index, not ``logits_to_keep=1``: the model's slice ``hidden[:, -1:]`` of n > 1 columns
    # is a strided view, and ``F.linear`` on a strided 3-D input whose weight needs no grad (an executor, a frozen
    # rollout copy) broadcasts the lm_head weight to a batched matmul, copying it once per row (SmolLM2, 16 rows:
    # 0.9 GB per prefill). The index gathers a contiguous [R, 1, H]; bf16 logits are the same bits.
    keep = 1 if n == 1 else torch.tensor([n - 1], device=input_ids.device)
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        use_cache=True,
        logits_to_keep=keep,
        **{name: cache},
    )
    after = cache.get_seq_length()
    if after != before + n:
        import transformers

        raise RuntimeError(
            f"forward_step: {type(model).__name__} did not write its {n} new tokens into the KV cache "
            f"(cache length {before} -> {after}); it was passed as {name}= "
            f"(transformers {transformers.__version__}). The model must take the cache under that name and append to it.")
    return out.logits[:, -1, :].float()  # [R, V]


@dataclass(frozen=True)
class TurnResult:
    """What one ``EpisodeBatch.step`` returns for one episode."""

    action_ids: list[int]             # sampled tokens, stop token included when sampled
    behavior_logprobs: list[float]    # one per action token
    stop_reason: str                  # "stop" | "length" | "context"
    truncated: bool                   # the context limit ended the episode (it has left the batch)


@dataclass
class _Episode:
    seed: int
    generator: torch.Generator
    token_ids: list[int] = field(default_factory=list)
    is_action: list[bool] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    turn_index: list[int] = field(default_factory=list)
    turns: list[TurnSpan] = field(default_factory=list)
    pending: int | None = None        # last sampled token, not yet fed (its K/V is not in the cache)
    position: int = 0                 # tokens fed so far == position id of the next fed token
    truncated: bool = False
    finished: bool = False


class EpisodeBatch:
    """A batch of episode sessions sharing one KV cache. Create with :meth:`RolloutEngine.new_batch`.

    Per turn call :meth:`step` with the new observation tokens of the episodes that act this turn; finished
    episodes leave with :meth:`finish`, which returns their :class:`Trajectory`. An episode whose context limit
    is reached is truncated (flag set, it leaves the batch by itself); this never raises mid-batch.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        seeds: Sequence[int],
        sampling: SamplingParams,
        *,
        cache_factory: CacheFactory = dynamic_cache_factory,
        pad_token_id: int = 0,
        max_context_tokens: int | None = None,
        info: Mapping[str, Any] | None = None,
    ) -> None:
        if not isinstance(sampling, SamplingParams):
            raise TypeError(f"sampling must be a SamplingParams, got {type(sampling).__name__}")
        if len(seeds) == 0:
            raise ValueError("seeds must name at least one episode")
        if max_context_tokens is not None and max_context_tokens < 2:
            raise ValueError(f"max_context_tokens must be >= 2 or None, got {max_context_tokens!r}")
        self.model = model
        self.sampling = sampling
        self.cache_factory = cache_factory
        self.pad_token_id = int(pad_token_id)
        self.max_context_tokens = max_context_tokens
        self.info = dict(info or {})
        self.device = _model_device(model)
        self.episodes = [_Episode(seed=int(s), generator=_generator(int(s))) for s in seeds]
        self._rows: list[int] = list(range(len(seeds)))  # cache row -> episode
        self._mask = torch.zeros((len(seeds), 0), dtype=torch.long, device=self.device)  # [R, K]
        self._cache: Cache | None = None

    # ------------------------------------------------------------------ public
    def __len__(self) -> int:
        return len(self.episodes)

    @property
    def live(self) -> list[int]:
        """Episodes still in the batch (not finished, not truncated)."""
        return list(self._rows)

    def cache_columns(self) -> int:
        return int(self._mask.shape[1])

    @torch.inference_mode()
    def step(self, observations: Mapping[int, Sequence[int]]) -> dict[int, TurnResult]:
        """Prefill each given episode's new observation tokens, then sample its action. -> {episode: TurnResult}.

        ``observations`` maps episode index -> token ids appended to its context before it acts (an empty
        list is allowed after the first turn). Live episodes not named here wait (their rows get masked columns).
        """
        chunks = self._validate(observations)
        results: dict[int, TurnResult] = {}
        acting: list[int] = []
        for ep, obs in chunks.items():
            e = self.episodes[ep]
            # Room for the observation and at least one action token, else the context limit truncates.
            if self.max_context_tokens is not None and len(e.token_ids) + len(obs) + 1 > self.max_context_tokens:
                e.truncated = True
                e.turns.append(TurnSpan(len(e.token_ids), len(e.token_ids), len(e.token_ids), "context"))
                results[ep] = TurnResult([], [], "context", True)
                continue
            turn = len(e.turns)
            obs_start = len(e.token_ids)
            e.token_ids.extend(obs)
            e.is_action.extend([False] * len(obs))
            e.logprobs.extend([0.0] * len(obs))
            e.turn_index.extend([turn] * len(obs))
            e.turns.append(TurnSpan(obs_start, len(e.token_ids), len(e.token_ids), ""))
            acting.append(ep)
        if acting:
            self._run_turn(acting, {ep: chunks[ep] for ep in acting}, results)
        self._drop([ep for ep in chunks if self.episodes[ep].truncated])
        return results

    def finish(self, episode: int) -> Trajectory:
        """Take ``episode`` out of the batch (its cache rows are freed) and return its trajectory."""
        self._check_index(episode)
        e = self.episodes[episode]
        if not e.finished and not e.truncated:
            self._drop([episode])
        e.finished = True
        return self.trajectory(episode)

    def finish_many(self, episodes: Sequence[int]) -> list[Trajectory]:
        """:meth:`finish` for several episodes at once: their cache rows are removed in one pass (finishing them one
        by one re-indexes the whole cache once per episode). The same trajectories and the same cache afterwards."""
        episodes = list(episodes)
        for ep in episodes:
            self._check_index(ep)
        self._drop([ep for ep in episodes if not self.episodes[ep].finished and not self.episodes[ep].truncated])
        return [self.finish(ep) for ep in episodes]

    def trajectory(self, episode: int) -> Trajectory:
        """The record of ``episode`` so far (see :mod:`interq.rollout.trajectory`)."""
        self._check_index(episode)
        e = self.episodes[episode]
        return Trajectory(
            episode=episode,
            seed=e.seed,
            token_ids=torch.tensor(e.token_ids, dtype=torch.long),
            action_mask=torch.tensor(e.is_action, dtype=torch.bool),
            behavior_logprobs=torch.tensor(e.logprobs, dtype=torch.float32),
            turn_index=torch.tensor(e.turn_index, dtype=torch.long),
            turns=tuple(e.turns),
            truncated=e.truncated,
            sampling=self.sampling,
            info=dict(self.info),
        )

    def close(self) -> list[Trajectory]:
        """Finish every episode; returns all trajectories in episode order and frees the cache."""
        self._drop(list(self._rows))
        out = [self.finish(i) for i in range(len(self.episodes))]
        self._cache = None
        return out

    # ------------------------------------------------------------------ internals
    def _check_index(self, episode: int) -> None:
        if not isinstance(episode, int) or not 0 <= episode < len(self.episodes):
            raise IndexError(f"episode must be an index in [0, {len(self.episodes)}), got {episode!r}")

    def _validate(self, observations: Mapping[int, Sequence[int]]) -> dict[int, list[int]]:
        if not isinstance(observations, Mapping):
            raise TypeError("observations must be a mapping {episode index: observation token ids}")
        chunks: dict[int, list[int]] = {}
        for ep, obs in observations.items():
            self._check_index(ep)
            e = self.episodes[ep]
            if e.finished or e.truncated:
                raise ValueError(f"episode {ep} has left the batch ({'truncated' if e.truncated else 'finished'}); it cannot step")
            ids = [int(t) for t in (obs.tolist() if isinstance(obs, torch.Tensor) else obs)]
            if not ids and not e.token_ids:
                raise ValueError(f"episode {ep}: the first observation must contain at least one token")
            chunks[ep] = ids
        return chunks

    def _run_turn(self, acting: list[int], obs: dict[int, list[int]], results: dict[int, TurnResult]) -> None:
        if self._cache is None:
            self._cache = self.cache_factory(getattr(self.model, "config", None))
        feed = {}
        for ep in acting:
            e = self.episodes[ep]
            feed[ep] = ([e.pending] if e.pending is not None else []) + obs[ep]
            e.pending = None
        logits = self._forward(feed)  # [R, V]
        row_of = {ep: r for r, ep in enumerate(self._rows)}
        active = list(acting)
        actions: dict[int, list[int]] = {ep: [] for ep in acting}
        action_lps: dict[int, list[float]] = {ep: [] for ep in acting}
        reason: dict[int, str] = {}
        stops = set(self.sampling.stop_token_ids)
        for _ in range(self.sampling.max_action_tokens):
            rows = [row_of[ep] for ep in active]
            gens = [self.episodes[ep].generator for ep in active]
            if rows != list(range(logits.shape[0])):  # only some cache rows sample: take theirs
                logits = logits.index_select(0, torch.tensor(rows, device=logits.device))  # [A, V]
            tokens, lps = sample_tokens(logits, self.sampling, gens)  # [A], [A]
            still = []
            for ep, tok, lp in zip(active, tokens.tolist(), lps.tolist()):
                e = self.episodes[ep]
                e.token_ids.append(tok)
                e.is_action.append(True)
                e.logprobs.append(lp)
                e.turn_index.append(len(e.turns) - 1)
                actions[ep].append(tok)
                action_lps[ep].append(lp)
                if tok in stops:
                    reason[ep] = "stop"
                elif self.max_context_tokens is not None and len(e.token_ids) >= self.max_context_tokens:
                    reason[ep] = "context"
                    e.truncated = True
                elif len(actions[ep]) >= self.sampling.max_action_tokens:
                    reason[ep] = "length"
                else:
                    still.append(ep)
                    continue
                e.pending = tok
            active = still
            if not active:
                break
            feed = {ep: [self.episodes[ep].token_ids[-1]] for ep in active}
            logits = self._forward(feed)  # [R, V]
        for ep in acting:
            e = self.episodes[ep]
            span = e.turns[-1]
            e.turns[-1] = TurnSpan(span.obs_start, span.act_start, len(e.token_ids), reason[ep])
            results[ep] = TurnResult(actions[ep], action_lps[ep], reason[ep], e.truncated)

    def _forward(self, feed: dict[int, list[int]]) -> torch.Tensor:
        """One forward: every cache row gets ``n = max len`` new columns, left-padded. -> logits [R, V]."""
        n = max(len(v) for v in feed.values())
        r = len(self._rows)
        input_ids = torch.full((r, n), self.pad_token_id, dtype=torch.long)  # [R, n]
        new_mask = torch.zeros((r, n), dtype=torch.long)  # [R, n]
        position_ids = torch.zeros((r, n), dtype=torch.long)  # [R, n]
        for row, ep in enumerate(self._rows):
            e = self.episodes[ep]
            ids = feed.get(ep, [])
            k = len(ids)
            position_ids[row, :] = e.position
            if k:
                input_ids[row, n - k :] = torch.tensor(ids, dtype=torch.long)
                new_mask[row, n - k :] = 1
                position_ids[row, n - k :] = torch.arange(e.position, e.position + k)
                e.position += k
        self._mask = torch.cat([self._mask, new_mask.to(self.device)], dim=1)  # [R, K + n]
        return forward_step(
            self.model, self._cache, input_ids.to(self.device), self._mask, position_ids.to(self.device)
        )

    def _drop(self, episodes: list[int]) -> None:
        """Remove episodes' rows from the cache and the mask, then drop columns no remaining row attends to."""
        gone = {ep for ep in episodes if ep in self._rows}
        if not gone:
            return
        keep = [r for r, ep in enumerate(self._rows) if ep not in gone]
        self._rows = [self._rows[r] for r in keep]
        if not keep:
            self._cache = None
            self._mask = torch.zeros((0, 0), dtype=torch.long, device=self.device)
            return
        idx = torch.tensor(keep, dtype=torch.long, device=self.device)
        self._mask = self._mask.index_select(0, idx)  # [R', K]
        if self._cache is not None:
            self._cache.batch_select_indices(idx)
            self._compact_columns()

    def _compact_columns(self) -> None:
        """Drop cache columns that no remaining row attends to.

        Done for ``DynamicLayer`` storage and its subclasses (e.g. the 8-bit ``QuantKVLayer``): every 4-D tensor
        attribute of the layer whose dim -2 is the cache length (keys, values, per-token scales) is sliced.
        Other caches keep their masked columns (correct, only slower).
        """
        used = self._mask.any(dim=0)  # [K]
        if bool(used.all()):
            return
        k = int(used.shape[0])
        layers = getattr(self._cache, "layers", None)
        if not layers or any(not isinstance(layer, DynamicLayer) or getattr(layer, "is_sliding", False) for layer in layers):
            return
        cols = used.nonzero().squeeze(-1)  # [K']
        for layer in layers:
            if not layer.is_initialized:
                continue
            for name, value in list(vars(layer).items()):
                if isinstance(value, torch.Tensor) and value.ndim == 4 and value.shape[-2] == k:
                    setattr(layer, name, value.index_select(-2, cols.to(value.device)))
        self._mask = self._mask.index_select(1, cols)  # [R, K']


class RolloutEngine:
    """Holds the executor (a transformers causal LM, or any module with its forward signature) and makes batches.

    ``model`` is called as ``model(input_ids=, attention_mask=, position_ids=, cache=, use_cache=True,
    logits_to_keep=)`` (``past_key_values=`` instead of ``cache=`` when its forward names that) and must return an object with ``.logits`` [R, 1, V]. ``cache_factory(model.config)``
    returns a fresh transformers ``Cache`` (default :func:`dynamic_cache_factory`; pass the quantized KV cache for
    W8A8-KV8).
    ``info`` is copied into every trajectory; an executor from ``interq.quant.make_executor`` adds its
    ``quant_config`` there by itself. The engine keeps a reference to ``model``: weight sync
    (``interq.quant.sync_weights(learner, executor)``) updates it in place between batches, nothing to re-wire.
    ``max_context_tokens`` (default: ``model.config.max_position_embeddings``) is the per-episode context limit.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        cache_factory: CacheFactory | None = None,
        pad_token_id: int = 0,
        max_context_tokens: int | None = None,
        info: Mapping[str, Any] | None = None,
    ) -> None:
        self.model = model
        self.cache_factory = cache_factory or dynamic_cache_factory
        self.pad_token_id = pad_token_id
        if max_context_tokens is None:
            max_context_tokens = getattr(getattr(model, "config", None), "max_position_embeddings", None)
        self.max_context_tokens = max_context_tokens
        self.info = dict(info or {})
        qcfg = getattr(model, "interq_qcfg", None)  # the W8A8 executor's QuantConfig (interq.quant)
        if qcfg is not None and dataclasses.is_dataclass(qcfg):
            self.info.setdefault("quant_config", dataclasses.asdict(qcfg))

    def new_batch(
        self, seeds: Sequence[int], sampling: SamplingParams, *, max_context_tokens: int | None = None
    ) -> EpisodeBatch:
        """A batch of ``len(seeds)`` episodes; episode i samples with ``torch.Generator().manual_seed(seeds[i])``."""
        return EpisodeBatch(
            self.model,
            seeds,
            sampling,
            cache_factory=self.cache_factory,
            pad_token_id=self.pad_token_id,
            max_context_tokens=max_context_tokens if max_context_tokens is not None else self.max_context_tokens,
            info=self.info,
        )


def _generator(seed: int) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(seed)
    return g


def _model_device(model: torch.nn.Module) -> torch.device:
    try:
        return next(model.parameters()).device
    except (StopIteration, AttributeError):
        return torch.device("cpu")
