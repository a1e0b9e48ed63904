"""The sampler's device-side draw (interq.rollout.sampling.device_race): Philox4x32-10 by integer tensor ops on the
logits' device, keyed by the episode's seed and draw index. Run here on CPU tensors: the same integer ops give the
same words on a GPU, so an episode's tokens do not depend on its batch there either."""

from __future__ import annotations

import math

import pytest
import torch

from interq.rollout.sampling import (SamplingParams, counter_uniforms, device_race, exponential_race, philox4x32,
                                     sample_tokens)

# Random123's published known-answer vectors for philox4x32-10: (counter, key) -> output words
KAT = [((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
       ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
       ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1))]


@pytest.mark.parametrize("counter,key,want", KAT)
def test_philox_gives_the_published_words(counter, key, want):
    t = lambda v: tuple(torch.tensor(x, dtype=torch.int64) for x in v)  # noqa: E731
    assert tuple(int(w) for w in philox4x32(t(counter), t(key))) == want


def _gens(seeds):
    return [torch.Generator().manual_seed(s) for s in seeds]


def test_a_row_depends_on_its_seed_and_draw_only():
    seeds, draws = [3, 2**64 - 1, 12345, 3], [0, 7, 2**40 + 1, 1]
    batch = counter_uniforms(seeds, draws, 1001, "cpu")  # [4, 1001]
    for i in range(4):
        assert torch.equal(counter_uniforms([seeds[i]], [draws[i]], 1001, "cpu")[0], batch[i])
        assert torch.equal(counter_uniforms([99, seeds[i], 5], [0, draws[i], 3], 1001, "cpu")[1], batch[i])
    assert not torch.equal(batch[0], batch[3])  # the next draw of the same episode: other numbers
    assert (batch >= 0).all() and (batch < 1).all()
    assert torch.equal(counter_uniforms([7], [0], 1000, "cpu")[0], counter_uniforms([7], [0], 1001, "cpu")[0, :1000])


def test_the_race_is_exp1():
    e = device_race(_gens(range(8)), 50_001, "cpu", draws=[0] * 8).double().flatten()
    assert not e.isnan().any() and (e > 0).all() and e.isfinite().all()
    assert abs(e.mean().item() - 1) < 0.01 and abs(e.var().item() - 1) < 0.02
    for t in (0.01, 1.0, 5.0, 9.0):
        expected = math.exp(-t)
        assert abs((e > t).double().mean().item() - expected) < 4 * math.sqrt(expected / e.numel()) + 1e-6, t
    u = counter_uniforms(list(range(8)), [0] * 8, 50_001, "cpu").flatten()  # neighbouring values not correlated
    corr = torch.corrcoef(torch.stack((u[:-1], u[1:])))[0, 1].item()
    assert abs(corr) < 0.01


def test_episode_tokens_do_not_depend_on_the_batch():
    params = SamplingParams(temperature=0.8, top_p=0.95)
    logits = torch.randn(6, 97, generator=torch.Generator().manual_seed(0)) * 3  # [6, V]
    seeds = [11, 12, 13, 14, 15, 16]
    steps = 8
    gens_all = _gens(seeds)
    together = [sample_tokens(logits, params, gens_all, device_draw=True) for _ in range(steps)]  # all six
    for i in (0, 3, 5):
        g = _gens([seeds[i]])
        alone = [sample_tokens(logits[i:i + 1], params, g, device_draw=True) for _ in range(steps)]
        other = _gens([99, seeds[i], 98])  # beside other companions, in another row
        mixed = [sample_tokens(torch.cat([logits[:1], logits[i:i + 1], logits[2:3]]), params, other, device_draw=True)
                 for _ in range(steps)]
        for step in range(steps):
            assert together[step][0][i] == alone[step][0][0] == mixed[step][0][1], (i, step)
            assert together[step][1][i] == alone[step][1][0] == mixed[step][1][1], (i, step)
    assert len({tuple(t.tolist()) for t, _ in together}) > 1  # the draws move on


def test_the_device_draw_samples_the_distribution():
    n = 20_000
    logits = torch.tensor([[0.0, 1.0, 2.0, -30.0]]).expand(n, -1)  # one row per episode, each its own seed
    tokens, _ = sample_tokens(logits, SamplingParams(temperature=1.0), _gens(range(n)), device_draw=True)
    freq = torch.bincount(tokens, minlength=4).double() / n
    assert (freq - torch.softmax(logits[0].double(), -1)).abs().max() < 4 * math.sqrt(0.25 / n)


def test_the_cpu_draw_is_unchanged_by_the_device_path():
    logits = torch.randn(3, 50)
    params = SamplingParams(temperature=1.0)
    a = sample_tokens(logits, params, _gens([1, 2, 3]))
    race = exponential_race(_gens([1, 2, 3]), 50)
    want = torch.softmax(logits.float(), -1).div(race).argmax(-1)
    assert torch.equal(a[0], want)
    sample_tokens(logits, params, _gens([1, 2, 3]), device_draw=True)  # a device draw leaves CPU generators alone
    g = _gens([1, 2, 3])
    sample_tokens(logits, params, g, device_draw=True)
    assert torch.equal(sample_tokens(logits, params, g)[0], want)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.cuda
def test_on_a_gpu_the_draw_stays_there_and_equals_the_cpu_words():
    u_cpu = counter_uniforms([3, 4], [0, 5], 4097, "cpu")
    u_gpu = counter_uniforms([3, 4], [0, 5], 4097, "cuda")
    assert u_gpu.is_cuda and torch.equal(u_gpu.cpu(), u_cpu)
