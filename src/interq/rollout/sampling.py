"""Sampling: the transform from logits to the distribution actually sampled from, and the draw.

Pure tensor functions, no model, no cache. The behavior log-prob of a sampled token is its fp32 log-prob
under the *transformed* distribution (temperature, then top-k, then top-p: the order of vLLM and HF),
which is the distribution the token was drawn from (``behavior_logprobs``, docs/algorithm.md).

Draws use one ``torch.Generator`` per episode and the exponential race
``argmax(p / E), E ~ Exp(1)`` (an exact sample from ``p``; tokens of probability 0 are never drawn).
Each draw consumes exactly ``V`` numbers from the episode's own generator, so an episode's tokens do not
depend on which other episodes share the batch (nor on the threads that draw the rows: ``exponential_race``).

Logits on another device (a GPU) draw there, by a counter-based generator (:func:`device_race`): Philox4x32-10
keyed by the episode (its generator's seed) and counting the episode's draws and the vocabulary, computed by
integer tensor ops on the logits' device. No [rows, vocab] tensor crosses to the host per token, and an episode's
tokens still depend on its seed and draw index only, never on its batch. The CPU path is unchanged (its numbers are
the recorded runs'); the two paths draw different numbers from the same seeds.
"""

from __future__ import annotations

import math
import os
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Sequence

import torch

NEG_INF = float("-inf")
_TINY = torch.finfo(torch.float64).tiny  # a uniform of 0 counts as this (exponential_race)


@dataclass(frozen=True)
class SamplingParams:
    """How actions are sampled; recorded with every trajectory.

    temperature: > 0 samples from softmax(logits / temperature); 0 means greedy (argmax), whose behavior
        log-prob is 0.0 (log of a point mass).
    top_k: keep the k most likely tokens (0 = off).
    top_p: nucleus sampling, keep the smallest set of most likely tokens whose mass reaches top_p (1.0 = off).
    max_action_tokens: per-turn limit on sampled tokens; reaching it ends the turn with stop reason "length".
    stop_token_ids: sampling one of these ends the turn (the stop token is part of the action).
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    max_action_tokens: int = 64
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.temperature, (int, float)) or not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"SamplingParams.temperature must be a finite number >= 0 (0 = greedy), got {self.temperature!r}")
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or self.top_k < 0:
            raise ValueError(f"SamplingParams.top_k must be an int >= 0 (0 = off), got {self.top_k!r}")
        if not isinstance(self.top_p, (int, float)) or not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"SamplingParams.top_p must be in (0, 1] (1.0 = off), got {self.top_p!r}")
        if not isinstance(self.max_action_tokens, int) or isinstance(self.max_action_tokens, bool) or self.max_action_tokens < 1:
            raise ValueError(f"SamplingParams.max_action_tokens must be an int >= 1, got {self.max_action_tokens!r}")
        stops = tuple(self.stop_token_ids)
        if any(not isinstance(t, int) or isinstance(t, bool) or t < 0 for t in stops):
            raise ValueError(f"SamplingParams.stop_token_ids must be non-negative token ids, got {self.stop_token_ids!r}")
        object.__setattr__(self, "stop_token_ids", stops)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def to_dict(self) -> dict:
        d = asdict(self)
        d["stop_token_ids"] = list(self.stop_token_ids)
        return d


def transformed_logprobs(logits: torch.Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """fp32 log-probs of the sampling distribution: temperature, then top-k, then top-p. [..., V] -> [..., V].

    Tokens removed by top-k / top-p get -inf. ``temperature`` must be > 0 here (greedy has no density).
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 for log-probs, got {temperature!r}")
    x = logits.float()  # [..., V]
    if temperature != 1.0:  # dividing by 1.0 is exact: skip the pass
        x = x / temperature
    vocab = x.shape[-1]
    if 0 < top_k < vocab:
        kth = torch.topk(x, top_k, dim=-1).values[..., -1:]  # [..., 1]
        x = x.masked_fill(x < kth, NEG_INF)  # [..., V]
    if top_p < 1.0:
        sorted_x, order = torch.sort(x, dim=-1, descending=True)  # [..., V]
        probs = torch.softmax(sorted_x, dim=-1)  # [..., V]
        mass_before = torch.cumsum(probs, dim=-1) - probs  # [..., V] mass of strictly more likely tokens
        remove = mass_before >= top_p  # [..., V]
        remove[..., 0] = False  # the most likely token always stays
        sorted_x = sorted_x.masked_fill(remove, NEG_INF)
        x = torch.empty_like(x).scatter_(-1, order, sorted_x)  # [..., V]
    return torch.log_softmax(x, dim=-1)  # [..., V]


_POOL: tuple[int, int, ThreadPoolExecutor] | None = None  # (pid, workers, pool)


def _pool(workers: int) -> ThreadPoolExecutor:
    """A process-wide pool of ``workers`` threads (a new one after a fork: threads do not survive it)."""
    global _POOL
    if _POOL is None or _POOL[:2] != (os.getpid(), workers):
        _POOL = (os.getpid(), workers, ThreadPoolExecutor(max_workers=workers, thread_name_prefix="interq-race"))
    return _POOL[2]


def exponential_race(generators: Sequence[torch.Generator], vocab: int) -> torch.Tensor:
    """E ~ Exp(1) of shape [N, vocab], row i drawn from ``generators[i]`` alone (exactly ``vocab`` numbers).

    E = -log(U) with U uniform on [0, 1) in float64 (53-bit grid), U = 0 taken as the smallest positive double
    (E = 744.4, so every token of positive probability keeps a positive race value and beats those of
    probability 0); E is never 0 (U < 1), so no race value is infinite or NaN. Drawing float64 uniforms and
    taking one vectorized log is 2.5-2.8x faster per row than ``Tensor.exponential_`` (0.35-0.41 vs 0.95-1.0 ms
    for 49k on this kind of CPU; since NUMERICS_VERSION 2). float32 uniforms would be faster still, but on their
    2^-24 grid E near 0 comes in steps of 6e-8 (U = 1 - 2^-24 is hit once in 16.7 million per token, 0.3% of
    draws of 49k): the race values p / E of the smallest E are too coarse, which distorts rare tokens.

    The draw is serial per generator: rows are split over ``torch.get_num_threads()`` Python threads (torch releases
    the GIL); each generator is used by one thread in its own order, so the numbers are those of the loop (a
    generator named for two rows draws them in row order, on one thread).
    """
    u = torch.empty((len(generators), vocab), dtype=torch.float64, device=generators[0].device)  # [N, V]
    workers = min(torch.get_num_threads(), len(generators))

    inference = u.is_inference()  # inference mode is per thread: the pool's threads take the caller's

    def fill(rows: range) -> None:
        with torch.inference_mode(inference):
            for i in rows:
                u[i].uniform_(generator=generators[i])

    if workers <= 1 or len({id(g) for g in generators}) < len(generators):  # a generator twice: in row order
        fill(range(len(generators)))
    else:
        list(_pool(workers).map(fill, [range(w, len(generators), workers) for w in range(workers)]))
    return u.clamp_min_(_TINY).log_().neg_().float()  # [N, V] fp32; E = -log U


# Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011): 10 rounds of two 32x32-bit
# multiplies and xors over a 4-word counter under a 2-word key, the key bumped by the Weyl constants each round
_PHILOX_M = (0xD2511F53, 0xCD9E8D57)
_PHILOX_W = (0x9E3779B9, 0xBB67AE85)
_MASK32 = 0xFFFFFFFF
_DRAWS: "weakref.WeakKeyDictionary[torch.Generator, int]" = weakref.WeakKeyDictionary()  # device draws per generator


def _mulhilo(a: torch.Tensor, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(high, low) 32-bit words of ``a * m`` for 32-bit ``a`` (int64 tensor) and constant ``m``, without leaving int64:
    ``m`` in 16-bit halves, every partial product below 2^49."""
    p_lo = a * (m & 0xFFFF)  # < 2^48
    t = a * (m >> 16) + (p_lo >> 16)  # < 2^49: the product >> 16
    return t >> 16, ((t & 0xFFFF) << 16) | (p_lo & 0xFFFF)


def philox4x32(counter: tuple[torch.Tensor, ...], key: tuple[torch.Tensor, torch.Tensor], rounds: int = 10):
    """Philox4x32 of four 32-bit counter words under two 32-bit key words (int64 tensors holding values in
    [0, 2^32), broadcast together) -> four 32-bit output words (int64). Pure integer ops: the same words on any
    device (tested against the published known-answer vectors)."""
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for r in range(rounds):
        if r:
            k0, k1 = (k0 + _PHILOX_W[0]) & _MASK32, (k1 + _PHILOX_W[1]) & _MASK32
        hi0, lo0 = _mulhilo(c0, _PHILOX_M[0])
        hi1, lo1 = _mulhilo(c2, _PHILOX_M[1])
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return c0, c1, c2, c3


def counter_uniforms(seeds: Sequence[int], draws: Sequence[int], vocab: int,
                     device: torch.device | str) -> torch.Tensor:
    """U [N, vocab] float64 in [0, 1) on ``device`` (53-bit grid): row i from Philox4x32-10 under the key ``seeds[i]``
    (its two 32-bit halves) with the counter (column pair, draw ``draws[i]``'s two 32-bit halves, 0): each counter
    gives two uniforms of 53 bits (27 + 26 bits of two words, as mt19937's ``genrand_res53``). A row depends only on
    its seed and draw index."""
    n, half = len(seeds), (vocab + 1) // 2
    if n != len(draws):
        raise ValueError(f"counter_uniforms: {n} seeds but {len(draws)} draw indices")
    meta = torch.tensor([[s & _MASK32, (s >> 32) & _MASK32, d & _MASK32, (d >> 32) & _MASK32]
                         for s, d in zip(seeds, draws)], dtype=torch.int64).to(device)  # [N, 4]: one small copy
    col = torch.arange(half, dtype=torch.int64, device=device)[None, :]  # [1, V/2]
    zero = torch.zeros((), dtype=torch.int64, device=device)
    w0, w1, w2, w3 = philox4x32((col, meta[:, 2:3], meta[:, 3:4], zero), (meta[:, 0:1], meta[:, 1:2]))  # [N, V/2]
    scale = 2.0 ** -53
    u0 = ((w0 >> 5) * 67108864 + (w1 >> 6)).double() * scale  # [N, V/2]
    u1 = ((w2 >> 5) * 67108864 + (w3 >> 6)).double() * scale
    return torch.stack((u0, u1), dim=-1).reshape(n, 2 * half)[:, :vocab]  # [N, V]


def device_race(generators: Sequence[torch.Generator], vocab: int, device: torch.device | str,
                draws: Sequence[int] | None = None) -> torch.Tensor:
    """E ~ Exp(1) [N, vocab] fp32 on ``device`` from :func:`counter_uniforms` keyed by each generator's seed
    (``initial_seed()``) and its draw index: ``draws`` where given, else how many device draws this process has made
    with that generator (counted here, then advanced by one). E = -log U as :func:`exponential_race` (U = 0 as the
    smallest positive double). The generators' own states are not used or advanced."""
    if draws is None:
        draws = []
        for g in generators:  # a generator named for two rows draws for them in row order
            draws.append(_DRAWS.get(g, 0))
            _DRAWS[g] = draws[-1] + 1
    u = counter_uniforms([g.initial_seed() for g in generators], draws, vocab, device)
    return u.clamp_min_(_TINY).log_().neg_().float()  # [N, V]


def sample_tokens(
    logits: torch.Tensor, params: SamplingParams, generators: Sequence[torch.Generator],
    device_draw: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row. logits [N, V] -> (tokens [N] long, behavior_logprobs [N] fp32).

    Row i draws with ``generators[i]`` only: on the CPU from its state, on another device by :func:`device_race`
    (its seed and draw count); ``device_draw=True`` takes the latter on the CPU too (tests). Greedy (temperature 0)
    draws nothing and returns log-prob 0.
    """
    if logits.ndim != 2 or logits.shape[0] != len(generators):
        raise ValueError(f"logits must be [N, V] with N == len(generators) ({len(generators)}), got {tuple(logits.shape)}")
    if params.greedy:
        tokens = logits.float().argmax(dim=-1)  # [N]
        return tokens, torch.zeros(tokens.shape, dtype=torch.float32, device=tokens.device)
    logp = transformed_logprobs(logits, params.temperature, params.top_k, params.top_p)  # [N, V]
    probs = logp.exp()  # [N, V]
    on_device = probs.device.type != "cpu" if device_draw is None else device_draw  # drawn where the logits are
    race = (device_race(generators, probs.shape[-1], probs.device) if on_device
            else exponential_race(generators, probs.shape[-1]))  # [N, V]
    tokens = probs.div_(race.to(probs.device)).argmax(dim=-1)  # [N] (probs is a temporary: divided in place)
    return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)  # [N], [N]
