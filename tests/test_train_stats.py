"""The study's statistics against closed forms and a brute-force reference."""

import math
import random

import pytest

from interq.train.stats import linear_trend, paired_difference, paired_difference_over_seeds, wilson_interval


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
