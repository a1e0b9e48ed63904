"""Sampling: the transform from logits to the distribution actually sampled from, and the draw.

Pure tensor functions, no model, no cache. The behavior log-prob of a sampled token is its fp32 log-prob
under the *transformed* distribution (temperature, then top-k, then top-p: the order of vLLM and HF),
which is the distribution the token was drawn from (interq-spec.md §1, ``behavior_logprobs``).

Draws use one ``torch.Generator`` per episode and the exponential race
``argmax(p / E), E ~ Exp(1)`` (an exact sample from ``p``; tokens of probability 0 are never drawn).
Each draw consumes exactly ``V`` numbers from the episode's own generator, so an episode's tokens do not
depend on which other episodes share the batch (nor on the threads that draw the rows: ``exponential_race``).
"""

from __future__ import annotations

import math
import os
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

    The draw is serial per generator. Where interq's CPU kernels load (:mod:`interq.quant.kernels`) the uniforms come
    from ``uniform_f64_rows``, which writes the numbers ``Tensor.uniform_`` would with each generator's mt19937
    run in bulk, rows over torch's threads (the same numbers and generator states, tested): the race of 16 rows of 49k
    took 6.0 ms against 17.1 with the threads below at 2 threads, 10.1 against 14.7 at one (an Intel Xeon,
    ``results/benchmarks/xeon-amx/2026-12-03-packed-bf16-multiturn/sampling.log``); the uniforms alone 3.8 -> 1.1 ms at one thread since the engine
    runs in blocks (nineteenth session). Otherwise rows are split over
    ``torch.get_num_threads()`` Python threads (torch releases the GIL); each generator is used by one thread in its
    own order, so the numbers are those of the loop (a generator named for two rows draws them in row order, on
    one thread).
    """
    u = torch.empty((len(generators), vocab), dtype=torch.float64, device=generators[0].device)  # [N, V]
    mod = _kernels() if u.device.type == "cpu" else None
    if mod is not None:
        mod.uniform_f64_rows(u, list(generators))
        return u.clamp_min_(_TINY).log_().neg_().float()  # [N, V] fp32; E = -log U
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


def _kernels():
    """interq's compiled CPU kernels when they load and have ``uniform_f64_rows`` (built once per machine, by
    ``scripts/setup.sh`` ahead), else None: the draw stays torch's own."""
    try:
        from interq.quant import kernels
    except ImportError:
        return None
    mod = kernels.load()
    return mod if mod is not None and hasattr(mod, "uniform_f64_rows") else None


def sample_tokens(
    logits: torch.Tensor, params: SamplingParams, generators: Sequence[torch.Generator]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row. logits [N, V] -> (tokens [N] long, behavior_logprobs [N] fp32).

    Row i draws with ``generators[i]`` only. Greedy (temperature 0) draws nothing and returns log-prob 0.
    """
    if logits.ndim != 2 or logits.shape[0] != len(generators):
        raise ValueError(f"logits must be [N, V] with N == len(generators) ({len(generators)}), got {tuple(logits.shape)}")
    if params.greedy:
        tokens = logits.float().argmax(dim=-1)  # [N]
        return tokens, torch.zeros(tokens.shape, dtype=torch.float32)
    logp = transformed_logprobs(logits, params.temperature, params.top_k, params.top_p)  # [N, V]
    probs = logp.exp()  # [N, V]
    race = exponential_race(generators, probs.shape[-1])  # [N, V]
    mod = _kernels() if probs.device.type == "cpu" else None
    if (mod is not None and hasattr(mod, "race_argmax") and race.device == probs.device
            and probs.dtype == race.dtype == torch.float32 and probs.is_contiguous() and race.is_contiguous()):
        tokens = mod.race_argmax(probs, race)  # [N]: the same division and argmax in one pass (no quotient tensor)
    else:
        tokens = probs.div_(race.to(probs.device)).argmax(dim=-1)  # [N] (probs is a temporary: divided in place)
    return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)  # [N], [N]
