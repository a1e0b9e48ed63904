"""The learner's forward computes each distinct row of a micro-batch once, in length buckets: the same log-probs
and gradients as one padded forward over every row, and packs that respect ``train.tokens_per_microbatch``."""

from types import SimpleNamespace

import pytest
import torch

from interq.quant.testing import tiny_causal_lm
from interq.rollout import sequence_logprobs
from interq.train import rl


def test_length_buckets_by_hand():
    # 100: 95, 81, 80 are >= 0.8 x 100; 79 opens a bucket; 50 < 0.8 x 79 opens one; 40 >= 0.8 x 50 joins it
    assert rl.length_buckets([100, 95, 81, 80, 79, 50, 40], fill=0.8) == [4, 1, 2]
    assert rl.forward_tokens([40, 100, 79, 81, 95, 50, 80], fill=0.8) == 4 * 100 + 79 + 2 * 50
    assert rl.length_buckets([7, 6, 5], fill=0.0) == [3]  # one bucket: the plain padded forward
    assert rl.forward_tokens([7, 6, 5], fill=0.0) == 21
    assert rl.length_buckets([7, 6, 5], fill=1.0) == [1, 1, 1]  # no padding at all
    assert rl.forward_tokens([7, 6, 5], fill=1.0) == 18
    assert rl.length_buckets([]) == [] and rl.forward_tokens([]) == 0


def _rows(lengths, repeat, vocab=96, seed=0):
    """Right-padded rows of the given lengths, row i a copy of row repeat[i] where given; the last 3 tokens of each
    row are its action."""
    g = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.zeros(len(lengths), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    act = torch.zeros_like(ids, dtype=torch.bool)
    for i, n in enumerate(lengths):
        src = repeat.get(i)
        ids[i, :n] = ids[src, :n] if src is not None else torch.randint(3, vocab, (n,), generator=g)
        mask[i, :n] = 1
        act[i, n - 3:n] = True
    return ids, mask, act


@pytest.mark.parametrize("fill", [0.0, 0.8, 1.0])
def test_distinct_bucketed_logprobs_and_gradient_equal_one_padded_forward(fill, monkeypatch):
    monkeypatch.setattr(rl.length_buckets, "__defaults__", (fill,))
    lengths = [30, 12, 30, 25, 12, 7, 30, 19]
    ids, mask, act = _rows(lengths, repeat={2: 0, 4: 1, 6: 0})  # rows 0, 2, 6 the same; 1 and 4 the same
    model = tiny_causal_lm("qwen3", vocab_size=96, num_layers=2)
    batch = SimpleNamespace(temperature=0.7, top_p=1.0)
    mb = {"input_ids": ids, "attention_mask": mask, "action_mask": act}
    coef = torch.randn(ids.shape, generator=torch.Generator().manual_seed(1))  # a different weight per copy

    def grads(logp):
        model.zero_grad()
        (coef * logp).sum().backward()
        return [p.grad.clone() for p in model.parameters()]

    plain = sequence_logprobs(model, ids, mask, temperature=0.7, score_mask=act)  # [8, 30]
    ref = grads(plain)
    ours = rl._sequence_logprobs(model, mb, batch)  # [8, 30]
    torch.testing.assert_close(ours[act], plain[act], rtol=1e-5, atol=1e-5)
    assert (ours[act] != 0).all() and (ours[~act] == 0).all()
    # a repeated row's gradient is the sum over its copies: the whole gradient agrees to fp32 summation order
    # (a copy counted once, or a sign flipped, moves it by O(1) of its norm)
    g, r = torch.cat([x.flatten() for x in grads(ours)]), torch.cat([x.flatten() for x in ref])
    assert float(r.norm()) > 0
    assert float((g - r).norm() / r.norm()) < 1e-5


def test_a_repeated_row_is_computed_once_in_length_buckets():
    lengths = [30, 12, 30, 25, 12, 7, 30, 19]
    ids, mask, act = _rows(lengths, repeat={2: 0, 4: 1, 6: 0})
    model = tiny_causal_lm("qwen3", vocab_size=96, num_layers=2)
    seen = []
    model.register_forward_hook(lambda m, a, kw, out: seen.append(tuple(kw["input_ids"].shape)), with_kwargs=True)
    with torch.no_grad():
        rl._sequence_logprobs(model, {"input_ids": ids, "attention_mask": mask, "action_mask": act},
                              SimpleNamespace(temperature=1.0, top_p=1.0))
    # distinct lengths 30, 25, 19, 12, 7 -> buckets (30, 25), (19), (12), (7) at fill 0.8
    assert seen == [(2, 30), (1, 19), (1, 12), (1, 7)]


def test_micro_batches_keep_episodes_whole_and_within_the_token_budget():
    lengths = [20, 40, 60, 20, 40, 60, 25, 50, 30, 30, 90, 10]
    episode = [0, 0, 0, 1, 1, 1, 2, 2, 3, 3, 4, 5]
    ids, mask, act = _rows(lengths, repeat={3: 0, 4: 1, 5: 2})  # episode 1 repeats episode 0
    batch = SimpleNamespace(input_ids=ids, attention_mask=mask, action_mask=act, row_episode=episode)
    budget = 150
    packs = rl.micro_batches(batch, list(range(len(lengths))), budget)
    assert sorted(r for p in packs for r in p) == list(range(len(lengths)))
    assert [r for p in packs for r in p] == list(range(len(lengths)))  # episodes in order
    for p in packs:
        assert len({episode[r] for r in p}) == len({e for e in episode if e in {episode[r] for r in p}})
        assert all(episode[r] not in {episode[q] for q in other} for other in packs if other is not p for r in p)
        distinct = {ids[r, :lengths[r]].numpy().tobytes(): lengths[r] for r in p}
        assert rl.forward_tokens(list(distinct.values())) <= budget or len({episode[r] for r in p}) == 1
    # episodes 0 and 1 together cost 60 + 40 + 20 = 120 tokens (the copies are free): one pack
    assert packs[0][:6] == [0, 1, 2, 3, 4, 5]
