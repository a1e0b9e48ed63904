"""Statistics of the comparison study: intervals for success rates and paired differences between arms.

Pure functions on plain Python lists (no torch, no config). Every arm is evaluated on the same held-out task
instances with the same sampling seeds (``interq.train.rl.evaluate``), so two arms' outcomes can be compared
episode by episode: the paired difference removes the task-difficulty variance that an unpaired comparison of
two success rates carries.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

Z95 = 1.959963984540054  # two-sided 95% normal quantile


def wilson_interval(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion (``successes`` out of ``n``); (nan, nan) when n = 0.

    Used for the pooled final success of an arm over seeds x held-out episodes: it treats those episodes as
    independent Bernoulli draws, which ignores the between-seed variance (reported beside it as ``final_std``).
    """
    if n <= 0:
        return (math.nan, math.nan)
    if not 0 <= successes <= n:
        raise ValueError(f"successes={successes} must be in [0, n={n}]")
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    # the closed form gives exactly 0 (k = 0) and 1 (k = n) at the ends; keep them exact despite rounding
    return (0.0 if successes == 0 else max(0.0, centre - half), 1.0 if successes == n else min(1.0, centre + half))


def paired_difference(a: Sequence[Sequence[int]], b: Sequence[Sequence[int]], *, resamples: int = 2000,
                      seed: int = 0) -> dict:
    """Mean of ``a - b`` over seeds x episodes and a 95% bootstrap interval that resamples held-out tasks.

    ``a[s][i]``, ``b[s][i]``: outcome (0/1) of held-out episode ``i`` in seed ``s`` of each arm; episode ``i`` is
    the same task instance and sampling seed in both arms and in every seed. The bootstrap draws episode indices
    with replacement (the task is the unit both arms share) and keeps every seed of a drawn index together.
    Returns ``{"diff", "ci95": [lo, hi], "n_seeds", "n_episodes"}``.
    """
    if len(a) != len(b) or not a:
        raise ValueError(f"a and b need the same, non-zero number of seeds; got {len(a)} and {len(b)}")
    n = len(a[0])
    if n == 0 or any(len(x) != n for x in (*a, *b)):
        raise ValueError("every seed of both arms needs the same, non-zero number of episodes")
    # per-episode difference averaged over seeds: d[i] = mean_s (a[s][i] - b[s][i])
    d = [sum(a[s][i] - b[s][i] for s in range(len(a))) / len(a) for i in range(n)]
    rng = random.Random(seed)
    means = sorted(sum(d[rng.randrange(n)] for _ in range(n)) / n for _ in range(resamples))
    lo = means[int(0.025 * (resamples - 1))]
    hi = means[int(math.ceil(0.975 * (resamples - 1)))]
    return {"diff": sum(d) / n, "ci95": [lo, hi], "n_seeds": len(a), "n_episodes": n}


def paired_difference_over_seeds(a: Sequence[Sequence[int]], b: Sequence[Sequence[int]], *, resamples: int = 2000,
                                 seed: int = 0) -> dict:
    """The same difference as :func:`paired_difference`, with a 95% bootstrap interval that resamples the RL seeds
    as well as the held-out tasks, and the difference of each seed.

    Seeds and tasks are crossed (every seed of both arms plays every task), so each bootstrap draw takes S seeds
    with replacement and, independently, n task indices with replacement, and averages ``a[s][i] - b[s][i]`` over
    the drawn (seed, task) cells. The interval then carries the between-seed variance that a tasks-only interval
    leaves out: with 2-3 seeds it is a coarse interval (only S**S distinct seed draws), honest about how few seeds
    there are, not a precise one. Returns ``{"diff", "ci95", "per_seed": [diff of seed s], "n_seeds", "n_episodes"}``.
    """
    base = paired_difference(a, b, resamples=1)  # validates the shapes; the mean
    s_count, n = base["n_seeds"], base["n_episodes"]
    d = [[a[s][i] - b[s][i] for i in range(n)] for s in range(s_count)]  # d[s][i]
    rng = random.Random(seed)
    means = []
    for _ in range(resamples):
        seeds = [rng.randrange(s_count) for _ in range(s_count)]
        tasks = [rng.randrange(n) for _ in range(n)]
        per_seed = [sum(d[s][i] for i in tasks) for s in range(s_count)]  # each seed's sum over the drawn tasks
        means.append(sum(per_seed[s] for s in seeds) / (s_count * n))
    means.sort()
    lo = means[int(0.025 * (resamples - 1))]
    hi = means[int(math.ceil(0.975 * (resamples - 1)))]
    return {"diff": base["diff"], "ci95": [lo, hi], "per_seed": [sum(row) / n for row in d],
            "n_seeds": s_count, "n_episodes": n}


def linear_trend(xs: Sequence[float], outcomes: Sequence[Sequence[Sequence[int]]], *, resamples: int = 2000,
                 seed: int = 0) -> dict:
    """Least-squares slope of final success against a dose ``x`` over several arms, with a 95% bootstrap interval
    that resamples the RL seeds and the held-out tasks.

    ``xs[j]``: the dose of arm j (e.g. log10 of InterQ's budget); ``outcomes[j][s][i]``: outcome (0/1) of held-out
    episode ``i`` in seed ``s`` of arm j, with the same seeds (same index = same RL seed) and the same episodes in
    every arm. The slope is that of the ordinary least-squares line through the arms' mean successes
    ``(xs[j], m[j])``. Each bootstrap draw takes S seed indices and n task indices with replacement, the same for
    every arm (seeds and tasks are shared by the arms, as in :func:`paired_difference_over_seeds`), and refits.
    Returns ``{"slope", "ci95", "intercept", "means", "n_seeds", "n_episodes"}``.
    """
    k = len(xs)
    if k < 2 or len(outcomes) != k:
        raise ValueError(f"need at least 2 arms with one dose each; got {k} doses and {len(outcomes)} arms")
    if len(set(xs)) < 2:
        raise ValueError("the doses must not all be equal")
    s_count = len(outcomes[0])
    if s_count == 0 or any(len(arm) != s_count for arm in outcomes):
        raise ValueError("every arm needs the same, non-zero number of seeds")
    n = len(outcomes[0][0])
    if n == 0 or any(len(row) != n for arm in outcomes for row in arm):
        raise ValueError("every seed of every arm needs the same, non-zero number of episodes")
    x_mean = sum(xs) / k
    sxx = sum((x - x_mean) ** 2 for x in xs)

    def fit(means: list[float]) -> tuple[float, float]:
        m_mean = sum(means) / k
        slope = sum((x - x_mean) * (m - m_mean) for x, m in zip(xs, means)) / sxx
        return slope, m_mean - slope * x_mean

    means = [sum(map(sum, arm)) / (s_count * n) for arm in outcomes]
    slope, intercept = fit(means)
    rng = random.Random(seed)
    slopes = []
    for _ in range(resamples):
        seeds = [rng.randrange(s_count) for _ in range(s_count)]
        tasks = [rng.randrange(n) for _ in range(n)]
        drawn = [sum(sum(arm[s][i] for i in tasks) for s in seeds) / (s_count * n) for arm in outcomes]
        slopes.append(fit(drawn)[0])
    slopes.sort()
    lo = slopes[int(0.025 * (resamples - 1))]
    hi = slopes[int(math.ceil(0.975 * (resamples - 1)))]
    return {"slope": slope, "ci95": [lo, hi], "intercept": intercept, "means": means, "n_seeds": s_count,
            "n_episodes": n}


__all__ = ["Z95", "linear_trend", "paired_difference", "paired_difference_over_seeds", "wilson_interval"]
