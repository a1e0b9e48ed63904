"""The learner's forward over right-padded rows runs causal attention without a mask
(``interq.rollout.trajectory.model_attention_mask``): the same log-probs bit for bit as the forward given the
padding mask, for the plain and the aligned learner, sdpa and eager attention, dense and MoE; the same gradients
to float rounding (torch's causal flash backward accumulates its blocks in another order than the masked one:
1e-7 relative seen; eager attention: bit for bit). Any other mask (left padding, a hole) is passed as it is."""

from __future__ import annotations

import pytest
import torch

from interq.quant import QuantConfig
from interq.quant.testing import tiny_causal_lm
from interq.rollout import sequence_logprobs
from interq.rollout import trajectory as T
from interq.train.rl import learner_context


def test_model_attention_mask_drops_only_right_padding():
    ones = torch.ones(2, 5, dtype=torch.long)
    assert T.model_attention_mask(ones) is None
    right = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    assert T.model_attention_mask(right) is None
    assert T.model_attention_mask(right.bool()) is None
    left = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    assert T.model_attention_mask(left) is left
    hole = torch.tensor([[1, 0, 1, 1, 0], [1, 1, 1, 1, 1]])
    assert T.model_attention_mask(hole) is hole


def _rows(lengths, width, vocab=128, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (len(lengths), width), generator=g)  # [B, L]
    mask = (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).long()  # [B, L] right-padded
    ids = torch.where(mask.bool(), ids, torch.zeros_like(ids))
    score = mask.bool() & (torch.rand(ids.shape, generator=g) < 0.3)  # [B, L] "action" tokens
    return ids, mask, score


def _logprobs_and_grad(model, ids, mask, score, align, qcfg, keep_mask: bool, monkeypatch):
    if keep_mask:  # the forward as it was: the padding mask given to the model
        monkeypatch.setattr(T, "model_attention_mask", lambda m: m)
    else:
        monkeypatch.undo()
    model.zero_grad(set_to_none=True)
    with learner_context(model, align, qcfg):
        lp = sequence_logprobs(model, ids, mask, temperature=0.9, score_mask=score)  # [B, L]
        adv = torch.linspace(-1, 1, lp.shape[0])[:, None]  # [B, 1]
        (-(lp * adv)[score].sum()).backward()
    grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    return lp.detach(), grads


@pytest.mark.parametrize("kind,attn,align", [("llama", "sdpa", False), ("qwen3", "sdpa", True),
                                             ("qwen3", "eager", False), ("qwen3_moe", "sdpa", True)])
def test_right_padded_rows_without_a_mask_are_the_masked_forward(kind, attn, align, monkeypatch):
    model = tiny_causal_lm(kind).train()
    model.set_attn_implementation(attn)
    # rows longer than one key block of torch's CPU flash kernel, ragged; and a row of one real token
    ids, mask, score = _rows([700, 513, 260, 1], 700)
    qcfg = QuantConfig() if align else None
    lp_masked, g_masked = _logprobs_and_grad(model, ids, mask, score, align, qcfg, True, monkeypatch)
    lp, g = _logprobs_and_grad(model, ids, mask, score, align, qcfg, False, monkeypatch)
    assert torch.equal(lp, lp_masked)
    assert bool(lp[score[:, 1:].any(-1)].ne(0).any())  # real values compared, not zeros
    assert len(g) == len(g_masked) > 0
    for a, b in zip(g, g_masked):
        if attn == "eager":
            assert torch.equal(a, b)
        else:  # float rounding of the backward's block order, far below a wrong mask (which moves log-probs)
            assert float((a - b).norm()) <= 1e-5 * float(b.norm()), float((a - b).norm() / b.norm())


def test_left_padded_rows_keep_their_mask_and_match_right_padding():
    model = tiny_causal_lm("qwen3")
    ids, mask, score = _rows([40, 25], 40)
    right = sequence_logprobs(model, ids, mask)  # [B, L]
    # row 1 left-padded: the same tokens at the end, positions still 0.. from its first real token
    lids, lmask = ids.clone(), mask.clone()
    lids[1] = torch.cat([torch.zeros(15, dtype=ids.dtype), ids[1, :25]])
    lmask[1] = torch.cat([torch.zeros(15, dtype=mask.dtype), mask[1, :25]])
    assert T.model_attention_mask(lmask) is lmask
    left = sequence_logprobs(model, lids, lmask)  # [B, L]
    torch.testing.assert_close(left[1, 16:], right[1, 1:25], rtol=1e-5, atol=1e-5)  # its first token: no prefix
    torch.testing.assert_close(left[0], right[0], rtol=0, atol=0)
