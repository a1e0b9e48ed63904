"""The study's statistics against closed forms and a brute-force reference."""

import math
import random

import pytest

import itertools

from interq.train.stats import (linear_trend, minimum_detectable_effect, paired_difference, paired_difference_over_seeds,
                                paired_t_over_seeds, regularized_beta, sample_std, seed_interval, seeds_for_mde,
                                sign_flip_test, stratified_permutation_test, student_t_cdf, student_t_quantile,
                                wilson_interval)


def test_wilson_matches_the_closed_form():
    # 20 of 100 at z = 1.96: the textbook value (0.1334, 0.2888)
    lo, hi = wilson_interval(20, 100)
    assert lo == pytest.approx(0.13337, abs=2e-5) and hi == pytest.approx(0.28883, abs=2e-5)
    # the interval contains p, stays in [0, 1], and narrows with n
    for k, n in [(0, 10), (10, 10), (3, 7), (300, 600)]:
        lo, hi = wilson_interval(k, n)
        assert 0.0 <= lo <= k / n <= hi <= 1.0
    assert wilson_interval(60, 300)[1] - wilson_interval(60, 300)[0] < wilson_interval(20, 100)[1] - wilson_interval(20, 100)[0]
    assert all(math.isnan(x) for x in wilson_interval(0, 0))
    with pytest.raises(ValueError, match="successes"):
        wilson_interval(11, 10)


def test_paired_difference_sign_and_interval():
    rng = random.Random(1)
    base = [[int(rng.random() < 0.3) for _ in range(200)] for _ in range(3)]
    better = [[max(x, int(rng.random() < 0.3)) for x in row] for row in base]  # never worse, often better
    res = paired_difference(better, base, resamples=500)
    naive = sum(x - y for ra, rb in zip(better, base) for x, y in zip(ra, rb)) / 600
    assert res["diff"] == pytest.approx(naive, abs=1e-12)
    assert res["diff"] > 0 and 0 < res["ci95"][0] <= res["diff"] <= res["ci95"][1]
    flipped = paired_difference(base, better, resamples=500)
    assert flipped["diff"] == pytest.approx(-res["diff"])
    same = paired_difference(base, base, resamples=200)
    assert same["diff"] == 0 and same["ci95"] == [0, 0]
    assert res["n_seeds"] == 3 and res["n_episodes"] == 200


def test_paired_difference_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="seeds"):
        paired_difference([[1, 0]], [[1, 0], [0, 1]])
    with pytest.raises(ValueError, match="episodes"):
        paired_difference([[1, 0]], [[1]])


def test_paired_difference_over_seeds_widens_with_seeds_that_disagree():
    rng = random.Random(2)
    base = [[int(rng.random() < 0.3) for _ in range(200)] for _ in range(3)]
    # seeds 0 and 2: a wins 40% of the tasks; seed 1: a equals b
    gain = [[1 if i % 5 < 2 else 0 for i in range(200)], [0] * 200, [1 if i % 5 < 2 else 0 for i in range(200)]]
    a = [[max(x, g) for x, g in zip(rb, rg)] for rb, rg in zip(base, gain)]
    over = paired_difference_over_seeds(a, base, resamples=1000)
    tasks = paired_difference(a, base, resamples=1000)
    per_seed = [sum(x - y for x, y in zip(ra, rb)) / 200 for ra, rb in zip(a, base)]
    assert over["per_seed"] == pytest.approx(per_seed, abs=1e-12) and per_seed[1] == 0 and per_seed[0] > 0.2
    assert over["diff"] == pytest.approx(tasks["diff"], abs=1e-12) == pytest.approx(sum(per_seed) / 3)
    # the tasks-only interval excludes the seed that gained nothing; resampling seeds reaches it
    assert tasks["ci95"][0] > 0.12
    assert over["ci95"][0] <= per_seed[1] + 0.02 and over["ci95"][1] >= min(per_seed[0], per_seed[2]) - 0.05
    flipped = paired_difference_over_seeds(base, a, resamples=1000)
    assert flipped["diff"] == pytest.approx(-over["diff"])
    assert flipped["ci95"] == pytest.approx([-over["ci95"][1], -over["ci95"][0]], abs=1e-12)  # same draws, negated


def test_paired_difference_over_seeds_equals_tasks_only_when_seeds_agree():
    rng = random.Random(3)
    base = [[int(rng.random() < 0.4) for _ in range(300)]] * 3  # three identical seeds
    a = [[max(x, int(i % 4 == 0)) for i, x in enumerate(base[0])]] * 3
    over = paired_difference_over_seeds(a, base, resamples=1000)
    tasks = paired_difference(a, base, resamples=1000)
    assert over["per_seed"] == [over["diff"]] * 3
    # identical seeds: the seed draw changes nothing, both intervals estimate the same spread
    for x, y in zip(over["ci95"], tasks["ci95"]):
        assert x == pytest.approx(y, abs=0.015)
    with pytest.raises(ValueError, match="seeds"):
        paired_difference_over_seeds([[1, 0]], [[1, 0], [0, 1]])


def _arm(success_per_seed, n=40):
    """One arm's outcomes [seeds][episodes]: seed s wins its first round(p * n) episodes."""
    return [[1 if i < round(p * n) else 0 for i in range(n)] for p in success_per_seed]


def test_linear_trend_slope_is_the_least_squares_line_through_the_means():
    xs = [-1.0, -0.6, -0.3, 0.0]
    arms = [_arm([0.5, 0.6]), _arm([0.55, 0.6]), _arm([0.7, 0.6]), _arm([0.8, 0.9])]
    res = linear_trend(xs, arms, resamples=200)
    means = [sum(map(sum, a)) / 80 for a in arms]
    # closed form of the OLS slope, written out
    xb, mb = sum(xs) / 4, sum(means) / 4
    slope = sum((x - xb) * (m - mb) for x, m in zip(xs, means)) / sum((x - xb) ** 2 for x in xs)
    assert res["slope"] == pytest.approx(slope, abs=1e-12) and slope > 0.2  # success rises with the dose
    assert res["intercept"] == pytest.approx(mb - slope * xb, abs=1e-12)
    assert res["means"] == pytest.approx(means)
    lo, hi = res["ci95"]
    assert 0 < lo <= res["slope"] <= hi, res["ci95"]  # a clear rise: the interval excludes 0 and has the right sign
    assert (res["n_seeds"], res["n_episodes"]) == (2, 40)


def test_linear_trend_flat_and_falling():
    flat = linear_trend([0.0, 1.0, 2.0], [_arm([0.6, 0.7])] * 3, resamples=200)
    assert flat["slope"] == pytest.approx(0.0, abs=1e-12) and flat["ci95"] == pytest.approx([0.0, 0.0], abs=1e-12)
    falling = linear_trend([0.0, 1.0], [_arm([0.9, 0.8]), _arm([0.3, 0.4])], resamples=200)
    assert falling["slope"] == pytest.approx(-0.5) and falling["ci95"][1] < 0


def test_linear_trend_widens_when_seeds_disagree():
    agree = linear_trend([0.0, 1.0], [_arm([0.5, 0.5]), _arm([0.7, 0.7])], resamples=500)
    disagree = linear_trend([0.0, 1.0], [_arm([0.5, 0.5]), _arm([0.4, 1.0])], resamples=500)
    assert agree["slope"] == pytest.approx(disagree["slope"])
    width = lambda r: r["ci95"][1] - r["ci95"][0]  # noqa: E731
    assert width(disagree) > 1.5 * width(agree)


def test_linear_trend_rejects_bad_shapes():
    with pytest.raises(ValueError, match="at least 2 arms"):
        linear_trend([0.0], [_arm([0.5])])
    with pytest.raises(ValueError, match="doses must not all be equal"):
        linear_trend([1.0, 1.0], [_arm([0.5]), _arm([0.6])])
    with pytest.raises(ValueError, match="same, non-zero number of seeds"):
        linear_trend([0.0, 1.0], [_arm([0.5]), _arm([0.6, 0.7])])
    with pytest.raises(ValueError, match="same, non-zero number of episodes"):
        linear_trend([0.0, 1.0], [_arm([0.5]), _arm([0.6], n=30)])


# Student's t quantiles from printed tables (two-sided 95% and one-sided 80%)
T_TABLE = [(0.975, 1, 12.7062), (0.975, 2, 4.3027), (0.975, 4, 2.7764), (0.975, 9, 2.2622), (0.975, 29, 2.0452),
           (0.8, 2, 1.0607), (0.8, 4, 0.9410), (0.8, 9, 0.8834), (0.995, 5, 4.0321)]


@pytest.mark.parametrize("p,df,expected", T_TABLE)
def test_t_quantile_matches_printed_tables(p, df, expected):
    assert student_t_quantile(p, df) == pytest.approx(expected, abs=2e-4)
    assert student_t_quantile(1 - p, df) == pytest.approx(-expected, abs=2e-4)
    assert student_t_cdf(expected, df) == pytest.approx(p, abs=2e-5)


def test_t_cdf_closed_forms():
    # df = 1 is the Cauchy distribution, df = 2 has F(t) = 1/2 + t / (2 sqrt(2 + t^2))
    for t in (-3.0, -0.5, 0.0, 0.7, 5.0):
        assert student_t_cdf(t, 1) == pytest.approx(0.5 + math.atan(t) / math.pi, abs=1e-10)
        assert student_t_cdf(t, 2) == pytest.approx(0.5 + t / (2 * math.sqrt(2 + t * t)), abs=1e-10)
    # a large df approaches the normal distribution
    assert student_t_quantile(0.975, 1e6) == pytest.approx(1.959964, abs=1e-4)
    # I_x(1, 1) = x and I_x(a, 1) = x**a
    assert regularized_beta(0.3, 1, 1) == pytest.approx(0.3, abs=1e-12)
    assert regularized_beta(0.6, 2.5, 1) == pytest.approx(0.6 ** 2.5, abs=1e-12)


def test_sample_std_and_seed_interval_by_hand():
    xs = [0.70, 0.72, 0.71]
    assert sample_std(xs) == pytest.approx(0.01, abs=1e-12)  # n - 1 in the denominator, not the population SD
    iv = seed_interval(xs)
    half = 4.302653 * 0.01 / math.sqrt(3)
    assert iv["mean"] == pytest.approx(0.71) and iv["ci95"] == pytest.approx([0.71 - half, 0.71 + half], abs=1e-6)
    one = seed_interval([0.5])
    assert one["mean"] == 0.5 and all(math.isnan(x) for x in one["ci95"])


def test_sign_flip_test_against_brute_force_and_its_floor():
    rng = random.Random(3)
    for s_count, grid in ((1, False), (2, False), (3, False), (5, False), (7, False), (6, True), (11, True),
                          (16, True)):
        # grid: differences of success rates over 1,000 episodes (multiples of 0.001), so sign patterns tie
        diffs = [rng.randint(-100, 200) / 1000 if grid else rng.uniform(-0.1, 0.2) for _ in range(s_count)]
        brute = sum(abs(sum(d * g for d, g in zip(diffs, signs))) >= abs(sum(diffs)) - 1e-9
                    for signs in itertools.product((1, -1), repeat=s_count)) / 2 ** s_count
        assert sign_flip_test(diffs) == pytest.approx(brute, abs=1e-12)
    # a study's 19 seeds: exact (the same share of all 2**19 patterns), which a Monte Carlo estimate approaches
    diffs = [rng.randint(-60, 120) / 1000 for _ in range(19)]
    exact = sign_flip_test(diffs)
    assert exact == pytest.approx(sign_flip_test(diffs, max_exact_seeds=16, resamples=200_000), abs=0.005)
    assert sign_flip_test([0.02, -0.02, 0.0]) == 1.0  # a zero mean
    # with every seed on one side, the p-value is its floor 2 / 2**S: 0.25 for 3 seeds, 0.0625 for 5
    assert sign_flip_test([0.26, 0.01, 0.17]) == pytest.approx(0.25)
    assert sign_flip_test([0.1] * 5) == pytest.approx(0.0625)
    # past the exact limit it is a Monte Carlo estimate of the same quantity
    many = [0.05] * 18 + [-0.01, 0.02]
    assert sign_flip_test(many, max_exact_seeds=16, resamples=20_000) < 1e-3


def test_paired_t_over_seeds_reproduces_the_hand_computation():
    # per-seed differences q-interq - q-tis of a 3-seed study: mean 0.1467, sample SD 0.1266, t(2) = 4.3027
    res = paired_t_over_seeds([0.26, 0.01, 0.17])
    assert res["diff"] == pytest.approx(0.146667, abs=1e-6)
    assert res["ci95"] == pytest.approx([-0.1679, 0.4612], abs=2e-4)
    assert res["p_sign_flip"] == pytest.approx(0.25)
    assert 0.15 < res["p_t"] < 0.2
    # MDE = (t_0.975 + t_0.8) * SE with 2 degrees of freedom
    assert res["mde"] == pytest.approx((4.3027 + 1.0607) * 0.126623 / math.sqrt(3), abs=1e-3)
    # a sign error would flip the interval: the negated differences give the mirrored interval
    neg = paired_t_over_seeds([-0.26, -0.01, -0.17])
    assert neg["ci95"] == pytest.approx([-res["ci95"][1], -res["ci95"][0]], abs=1e-9)


def test_mde_shrinks_with_seeds_as_t_quantiles_say():
    sd = 0.03
    mdes = [minimum_detectable_effect(sd / math.sqrt(n), n - 1) for n in (3, 5, 10, 20)]
    assert mdes == sorted(mdes, reverse=True)
    assert mdes[1] == pytest.approx((2.7764 + 0.9410) * sd / math.sqrt(5), abs=1e-4)
    assert math.isnan(minimum_detectable_effect(math.nan, 4))


def test_seeds_for_mde_is_the_first_seed_count_whose_mde_fits():
    def naive(sd, target):
        s = 2
        while (minimum_detectable_effect(sd / math.sqrt(s), s - 1)) > target:
            s += 1
        return s

    for sd in (0.0, 0.01, 0.029, 0.04, 0.056, 0.12):
        assert seeds_for_mde(sd, 0.03) == naive(sd, 0.03)
    # closed form at the boundary, SD 0.04: 16 seeds give (2.1314 + 0.8662) * 0.04 / sqrt(16) = 0.02998 <= 0.03,
    # 15 give (2.1448 + 0.8681) * 0.04 / sqrt(15) = 0.0311 > 0.03
    assert (2.1314 + 0.8662) * 0.04 / 4 <= 0.03 < (2.1448 + 0.8681) * 0.04 / math.sqrt(15)
    assert seeds_for_mde(0.04, 0.03) == 16
    # a larger spread or a smaller target needs more seeds; no spread needs the fewest a t test can use
    assert seeds_for_mde(0.056, 0.03) > seeds_for_mde(0.04, 0.03) < seeds_for_mde(0.04, 0.02)
    assert seeds_for_mde(0.0, 0.03) == 2
    assert seeds_for_mde(math.nan, 0.03) is None and seeds_for_mde(1.0, 1e-4, max_seeds=100) is None
    with pytest.raises(ValueError, match="target"):
        seeds_for_mde(0.04, 0.0)


def test_stratified_permutation_test_exact_count():
    # 3 seeds, 2 arms per group, every A above every B in each seed: only the observed labelling and its mirror are
    # at least as extreme among C(4, 2)**3 = 216 within-seed relabellings
    strata = [([0.70, 0.68], [0.50, 0.55]), ([0.69, 0.70], [0.45, 0.60]), ([0.65, 0.66], [0.60, 0.62])]
    res = stratified_permutation_test(strata)
    assert res["relabellings"] == 216 and res["exact"]
    assert res["p"] == pytest.approx(2 / 216)
    naive = sum(sum(a) / 2 - sum(b) / 2 for a, b in strata) / 3
    assert res["diff"] == pytest.approx(naive)
    flipped = stratified_permutation_test([(b, a) for a, b in strata])
    assert flipped["diff"] == pytest.approx(-naive) and flipped["p"] == pytest.approx(res["p"])
    # identical groups: every relabelling ties, p = 1
    assert stratified_permutation_test([([0.5, 0.5], [0.5, 0.5])])["p"] == 1.0
    with pytest.raises(ValueError, match="each group"):
        stratified_permutation_test([([0.5], [])])
