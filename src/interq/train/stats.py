"""Statistics of the comparison study: intervals for success rates and paired differences between arms.

Pure functions on plain Python lists (no torch, no config). Every arm is evaluated on the same held-out task
instances with the same sampling seeds (``interq.train.rl.evaluate``), so two arms' outcomes can be compared
episode by episode: the paired difference removes the task-difficulty variance that an unpaired comparison of
two success rates carries.
"""

from __future__ import annotations

import bisect
import itertools
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


# --- seed-level inference -------------------------------------------------------------------------------------------
# The RL seed is the unit of replication: two runs of one arm differ by their seed's whole training trajectory, and
# that variance is invisible to an interval that resamples held-out episodes only. The functions below treat each
# seed's number (an arm's final success, or a paired difference between two arms in one seed) as one observation.


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the regularized incomplete beta function (modified Lentz), for x < (a + 1) / (a + b + 2)."""
    tiny, eps = 1e-300, 1e-15
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        m2 = 2 * m
        for num in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < eps:
            break
    return h


def regularized_beta(x: float, a: float, b: float) -> float:
    """I_x(a, b), the regularized incomplete beta function, for 0 <= x <= 1 and a, b > 0."""
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"x={x} must be in [0, 1]")
    if x in (0.0, 1.0):
        return x
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _betacf(a, b, x) / a
    return 1.0 - math.exp(log_front) * _betacf(b, a, 1.0 - x) / b


def student_t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` degrees of freedom."""
    if df <= 0:
        raise ValueError(f"df={df} must be > 0")
    tail = 0.5 * regularized_beta(df / (df + t * t), df / 2.0, 0.5)  # P(T > |t|)
    return 1.0 - tail if t >= 0 else tail


def student_t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom (bisection on :func:`student_t_cdf`)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p={p} must be in (0, 1)")
    if p < 0.5:
        return -student_t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while student_t_cdf(hi, df) < p:
        lo, hi = hi, hi * 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if student_t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)


def sample_std(xs: Sequence[float]) -> float:
    """Sample standard deviation (n - 1 in the denominator); 0.0 for fewer than two values."""
    n = len(xs)
    if n < 2:
        return 0.0
    m = sum(xs) / n
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1))


def minimum_detectable_effect(se: float, df: float, *, alpha: float = 0.05, power: float = 0.8) -> float:
    """The smallest true difference a two-sided t test at level ``alpha`` detects with probability ``power``, for a
    standard error ``se`` with ``df`` degrees of freedom: ``(t_{1-alpha/2} + t_{power}) * se`` (the usual
    approximation to the noncentral t; within a few percent of it for df >= 4). ``nan`` where ``se`` is nan."""
    if math.isnan(se) or df <= 0:
        return math.nan
    return (student_t_quantile(1.0 - alpha / 2.0, df) + student_t_quantile(power, df)) * se


def seeds_for_mde(sd: float, target: float, *, alpha: float = 0.05, power: float = 0.8,
                  max_seeds: int = 10_000) -> int | None:
    """How many seeds a paired comparison needs for a minimum detectable effect of at most ``target``, at a
    between-seed SD ``sd`` of the per-seed differences: the smallest ``S >= 2`` with
    ``(t_{1-alpha/2, S-1} + t_{power, S-1}) * sd / sqrt(S) <= target`` (:func:`minimum_detectable_effect` at
    ``S`` seeds). None where ``sd`` is nan or more than ``max_seeds`` would be needed."""
    if target <= 0.0:
        raise ValueError(f"target={target}: expected a minimum detectable effect > 0")
    if math.isnan(sd):
        return None

    def fits(s: int) -> bool:
        return minimum_detectable_effect(sd / math.sqrt(s), s - 1, alpha=alpha, power=power) <= target

    if not fits(max_seeds):
        return None
    lo, hi = 2, max_seeds  # the MDE falls with S, so the first S that fits is found by bisection
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if fits(mid) else (mid + 1, hi)
    return lo


def seed_interval(values: Sequence[float], *, alpha: float = 0.05) -> dict:
    """Mean over seeds with its t interval: ``{"mean", "sd" (sample), "se", "ci95", "n"}``; the interval is
    ``[nan, nan]`` for a single seed (no between-seed variance can be estimated from one)."""
    n = len(values)
    if n == 0:
        raise ValueError("need at least one seed")
    mean = sum(values) / n
    sd = sample_std(values)
    if n < 2:
        return {"mean": mean, "sd": 0.0, "se": math.nan, "ci95": [math.nan, math.nan], "n": n}
    se = sd / math.sqrt(n)
    half = student_t_quantile(1.0 - alpha / 2.0, n - 1) * se
    return {"mean": mean, "sd": sd, "se": se, "ci95": [mean - half, mean + half], "n": n}


def _signed_sums(xs: Sequence[float]) -> list[float]:
    """The sums of ``xs`` under all 2**len(xs) sign patterns."""
    sums = [0.0]
    for x in xs:
        sums = [s + x for s in sums] + [s - x for s in sums]
    return sums


def sign_flip_test(diffs: Sequence[float], *, max_exact_seeds: int = 40, resamples: int = 100_000,
                   seed: int = 0) -> float:
    """Two-sided p-value of the paired permutation (sign-flip) test of "mean difference = 0" over seeds.

    Under the null each seed's difference is as likely to have the other sign, so the p-value is the share of the
    2**S sign patterns whose |mean| is at least the observed |mean|. Exact for S <= ``max_exact_seeds`` (then it
    cannot go below 2 / 2**S: 0.25 for 3 seeds, 0.0625 for 5), counted by meeting in the middle: the signed sums of
    each half of the seeds (2**(S/2) each), one half sorted, the patterns whose total reaches the observed |sum|
    counted by bisection. A Monte Carlo estimate beyond.
    """
    s_count = len(diffs)
    if s_count == 0:
        raise ValueError("need at least one seed")
    observed = abs(sum(diffs)) - 1e-12 * max(1.0, sum(abs(x) for x in diffs))
    if observed <= 0:  # a zero mean: every pattern is at least as far from 0
        return 1.0
    if s_count <= max_exact_seeds:
        half = s_count // 2
        right = sorted(_signed_sums(diffs[half:]))
        hits = sum(len(right) - bisect.bisect_left(right, observed - a) + bisect.bisect_right(right, -observed - a)
                   for a in _signed_sums(diffs[:half]))
        return hits / 2 ** s_count
    rng = random.Random(seed)
    hits = sum(abs(sum(x if rng.random() < 0.5 else -x for x in diffs)) >= observed for _ in range(resamples))
    return (hits + 1) / (resamples + 1)


def paired_t_over_seeds(diffs: Sequence[float], *, alpha: float = 0.05, power: float = 0.8) -> dict:
    """Inference on a paired difference between two arms from its per-seed values ``diffs`` (arm A minus arm B in
    each seed, both on the same held-out episodes): the mean, the paired t interval over seeds, the exact sign-flip
    p-value (:func:`sign_flip_test`), the two-sided t test's p-value, and the minimum detectable effect at
    ``power`` (:func:`minimum_detectable_effect`) from the observed between-seed SD: the smallest true difference
    this many seeds would detect with that probability at this seed-to-seed (plus evaluation) noise."""
    iv = seed_interval(diffs, alpha=alpha)
    n = iv["n"]
    if n < 2 or iv["se"] == 0.0:
        p_t = math.nan if n < 2 else (1.0 if iv["mean"] == 0.0 else 0.0)
    else:
        p_t = 2.0 * (1.0 - student_t_cdf(abs(iv["mean"]) / iv["se"], n - 1))
    return {"diff": iv["mean"], "ci95": iv["ci95"], "sd": iv["sd"], "se": iv["se"], "n_seeds": n,
            "p_t": p_t, "p_sign_flip": sign_flip_test(diffs),
            "mde": minimum_detectable_effect(iv["se"], n - 1, alpha=alpha, power=power) if n >= 2 else math.nan}


def stratified_permutation_test(strata: Sequence[tuple[Sequence[float], Sequence[float]]], *,
                                max_exact: int = 200_000, resamples: int = 100_000, seed: int = 0) -> dict:
    """Does group A beat group B, with the seed as the stratum? ``strata[s] = (a_values, b_values)``: e.g. the final
    success of each aligned arm and of each unaligned arm in seed ``s``. The statistic is the mean over strata of
    ``mean(a) - mean(b)``; under the null the A/B labels are exchangeable within each stratum (not across: seeds
    differ), so the two-sided p-value is the share of within-stratum relabellings whose |statistic| is at least the
    observed one. Exact when the number of relabellings is at most ``max_exact``, Monte Carlo beyond.
    Returns ``{"diff", "p", "relabellings", "exact", "n_strata"}``."""
    if not strata:
        raise ValueError("need at least one stratum")
    pools, sizes = [], []
    for a, b in strata:
        if not a or not b:
            raise ValueError("every stratum needs at least one value in each group")
        pools.append(list(a) + list(b))
        sizes.append(len(a))

    def stat(splits):
        return sum(sum(pool[i] for i in idx) / k - (sum(pool) - sum(pool[i] for i in idx)) / (len(pool) - k)
                   for pool, k, idx in zip(pools, sizes, splits)) / len(pools)

    observed = stat([tuple(range(k)) for k in sizes])
    tol = 1e-12 * max(1.0, abs(observed))
    total = math.prod(math.comb(len(p), k) for p, k in zip(pools, sizes))
    if total <= max_exact:
        choices = [list(itertools.combinations(range(len(p)), k)) for p, k in zip(pools, sizes)]
        hits = sum(abs(stat(splits)) >= abs(observed) - tol for splits in itertools.product(*choices))
        p_value = hits / total
    else:
        rng = random.Random(seed)
        hits = sum(abs(stat([tuple(rng.sample(range(len(p)), k)) for p, k in zip(pools, sizes)])) >= abs(observed) - tol
                   for _ in range(resamples))
        p_value = (hits + 1) / (resamples + 1)
    return {"diff": observed, "p": p_value, "relabellings": total, "exact": total <= max_exact, "n_strata": len(pools)}


__all__ = ["Z95", "linear_trend", "minimum_detectable_effect", "paired_difference", "paired_difference_over_seeds",
           "paired_t_over_seeds", "regularized_beta", "sample_std", "seed_interval", "sign_flip_test",
           "stratified_permutation_test", "student_t_cdf", "student_t_quantile", "wilson_interval"]
