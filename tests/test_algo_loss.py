"""interq.algo.loss: the decoupled PPO loss (docs/algorithm.md) against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from interq.algo.loss import AGGREGATIONS, ppo_loss


def _hand_batch():
    # token:          1           2          3          4          5 (dropped, NaN proximal)
    ratio = torch.tensor([[1.5, 0.5, 0.5, 1.5, 1.0]])
    prox = torch.tensor([[-1.0, -2.0, -0.5, -3.0, math.nan]])
    cur = (prox.nan_to_num(0.0) + ratio.log()).requires_grad_(True)
    adv = torch.tensor([[1.0, 1.0, -1.0, -2.0, 5.0]])
    w = torch.tensor([[1.0, 2.0, 1.0, 0.5, 7.0]])
    keep = torch.tensor([[True, True, True, True, False]])
    return cur, prox, adv, w, keep


def test_token_mean_by_hand():
    cur, prox, adv, w, keep = _hand_batch()
    loss, m = ppo_loss(cur, prox, adv, w, keep, eps_low=0.2, eps_high=0.2)
    # per-token: -1.2 (clipped high), -1.0 (w=2, unclipped 0.5), +0.8 (clipped low), +1.5 (w=.5, unclipped -3)
    assert loss.item() == pytest.approx((-1.2 - 1.0 + 0.8 + 1.5) / 4, abs=1e-6)
    loss.backward()
    # d/d current of -w*ratio*A where unclipped, 0 where the clip is active, 0 on dropped tokens
    assert cur.grad[0].tolist() == pytest.approx([0.0, -2 * 0.5 / 4, 0.0, 0.5 * 2 * 1.5 / 4, 0.0], abs=1e-6)
    assert m["ppo/clip_frac"] == pytest.approx(0.5)
    assert m["ppo/clip_frac_high"] == pytest.approx(0.25)
    assert m["ppo/clip_frac_low"] == pytest.approx(0.25)
    assert m["ppo/ratio_max"] == pytest.approx(1.5)
    assert m["ppo/ratio_min"] == pytest.approx(0.5)
    assert m["ppo/kept_tokens"] == 4
    k3 = sum(r - 1 - math.log(r) for r in (1.5, 0.5, 0.5, 1.5)) / 4
    assert m["ppo/approx_kl"] == pytest.approx(k3, rel=1e-5)
    assert all(math.isfinite(v) for v in m.values())


def test_asymmetric_clip_and_no_clip():
    cur, prox, adv, w, keep = _hand_batch()
    loss, m = ppo_loss(cur, prox, adv, w, keep, eps_low=0.2, eps_high=0.6)  # token 1 no longer clipped
    assert loss.item() == pytest.approx((-1.5 - 1.0 + 0.8 + 1.5) / 4, abs=1e-6)
    assert m["ppo/clip_frac_high"] == 0.0
    loss, _ = ppo_loss(cur, prox, adv, w, keep, eps_low=0.9, eps_high=10.0)  # plain IS objective
    assert loss.item() == pytest.approx((-1.5 - 1.0 + 0.5 + 1.5) / 4, abs=1e-6)


def test_seq_mean_token_mean_by_hand():
    cur = torch.zeros(2, 3, requires_grad=True)  # ratio 1 everywhere: loss_tok = -w * A
    adv = torch.tensor([1.0, -2.0])  # per-row advantages broadcast to tokens
    w = torch.tensor([[1.0, 3.0, 9.0], [2.0, 9.0, 9.0]])
    keep = torch.tensor([[True, True, False], [True, False, False]])
    loss, _ = ppo_loss(cur, None, adv, w, keep, aggregation="seq_mean_token_mean")
    row0 = (-1 - 3) / 2
    row1 = 4.0
    assert loss.item() == pytest.approx((row0 + row1) / 2)
    loss_tm, _ = ppo_loss(cur, None, adv, w, keep, aggregation="token_mean")
    assert loss_tm.item() == pytest.approx((-1 - 3 + 4) / 3)
    # rows without kept tokens do not count in the sequence mean
    keep2 = torch.cat([keep, torch.zeros(1, 3, dtype=torch.bool)])
    cur2 = torch.zeros(3, 3)
    loss2, _ = ppo_loss(cur2, None, torch.tensor([1.0, -2.0, 3.0]), torch.cat([w, w[:1]]), keep2, aggregation="seq_mean_token_mean")
    assert loss2.item() == pytest.approx(loss.item())


def test_seq_mean_over_trajectories_matches_the_concatenated_layout():
    """Per-turn rows with seq_ids (traj_id) give the loss and gradient of one concatenated row per trajectory."""
    g = torch.Generator().manual_seed(1)
    # trajectory 0: turns of 2, 3 and 1 action tokens; trajectory 1: one turn of 4 tokens
    lengths, traj = [2, 3, 1, 4], torch.tensor([0, 0, 0, 1])
    logits = [torch.randn(n, generator=g) * 0.3 - 1 for n in lengths]
    prox = [x + torch.randn(len(x), generator=g) * 0.2 for x in logits]
    adv = [torch.full((n,), a) for n, a in zip(lengths, (1.5, 1.5, 1.5, -0.5))]

    def pad(parts, width):
        out = torch.zeros(len(parts), width)
        for i, x in enumerate(parts):
            out[i, : len(x)] = x
        return out

    cur_t = pad(logits, 4).requires_grad_(True)
    keep_t = pad([torch.ones(n) for n in lengths], 4).bool()
    loss_t, _ = ppo_loss(cur_t, pad(prox, 4), pad(adv, 4), None, keep_t, aggregation="seq_mean_token_mean",
                         seq_ids=traj)
    cat = [torch.cat(logits[:3]), logits[3]]
    cur_c = pad(cat, 6).requires_grad_(True)
    keep_c = pad([torch.ones(6), torch.ones(4)], 6).bool()
    loss_c, _ = ppo_loss(cur_c, pad([torch.cat(prox[:3]), prox[3]], 6), pad([torch.cat(adv[:3]), adv[3]], 6), None,
                         keep_c, aggregation="seq_mean_token_mean")
    torch.testing.assert_close(loss_t, loss_c)
    loss_t.backward()
    loss_c.backward()
    torch.testing.assert_close(torch.cat([cur_t.grad[i, :n] for i, n in enumerate(lengths)]),
                               torch.cat([cur_c.grad[0, :6], cur_c.grad[1, :4]]))
    # without seq_ids every turn is its own sequence: the 1-token turn would weigh as much as the 3-token turn
    loss_rows, _ = ppo_loss(cur_t, pad(prox, 4), pad(adv, 4), None, keep_t, aggregation="seq_mean_token_mean")
    assert abs(loss_rows.item() - loss_c.item()) > 1e-3
    with pytest.raises(ValueError, match="seq_ids"):
        ppo_loss(cur_t, None, pad(adv, 4), None, keep_t, aggregation="seq_mean_token_mean", seq_ids=traj[:2])


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_gradient_accumulation_equals_full_batch(aggregation):
    g = torch.Generator().manual_seed(0)
    B, L = 8, 10
    base = torch.randn(B, L, generator=g) * 0.3 - 1
    prox = base + torch.randn(B, L, generator=g) * 0.2
    adv = torch.randn(B, L, generator=g)
    w = torch.rand(B, L, generator=g) + 0.5
    keep = torch.rand(B, L, generator=g) < 0.7
    keep[3] = False  # a row with no kept token
    full_cur = base.clone().requires_grad_(True)
    full, _ = ppo_loss(full_cur, prox, adv, w, keep, eps_low=0.1, eps_high=0.15, aggregation=aggregation)
    full.backward()
    acc_cur = base.clone().requires_grad_(True)
    n_tok = int(keep.sum())
    n_seq = int(keep.any(1).sum())
    total = 0.0
    for sl in (slice(0, 2), slice(2, 5), slice(5, 8)):
        part, _ = ppo_loss(acc_cur[sl], prox[sl], adv[sl], w[sl], keep[sl], eps_low=0.1, eps_high=0.15, aggregation=aggregation, num_tokens=n_tok, num_seqs=n_seq)
        part.backward()
        total += part.item()
    assert total == pytest.approx(full.item(), abs=1e-6)
    assert torch.allclose(acc_cur.grad, full_cur.grad, atol=1e-7)


def test_proximal_none_is_current_detached_and_weights_not_differentiated():
    cur = torch.randn(2, 4, requires_grad=True)
    adv = torch.tensor([[1.0, -1.0, 2.0, 0.5], [0.3, 0.2, -0.1, 1.0]])
    w = torch.rand(2, 4, requires_grad=True)
    keep = torch.ones(2, 4, dtype=torch.bool)
    loss, m = ppo_loss(cur, None, adv, w, keep)
    assert loss.item() == pytest.approx(-(w * adv).mean().item(), rel=1e-6)
    loss.backward()
    assert w.grad is None
    assert torch.allclose(cur.grad, -(w.detach() * adv) / 8)
    assert m["ppo/clip_frac"] == 0.0 and m["ppo/approx_kl"] == pytest.approx(0.0, abs=1e-7)


def test_loss_bad_inputs():
    cur = torch.zeros(2, 3)
    keep = torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match="unknown aggregation='mean'.*token_mean"):
        ppo_loss(cur, None, torch.zeros(2), None, keep, aggregation="mean")
    with pytest.raises(ValueError, match="advantages shape"):
        ppo_loss(cur, None, torch.zeros(3), None, keep)
    with pytest.raises(TypeError, match="keep_mask must have dtype torch.bool"):
        ppo_loss(cur, None, torch.zeros(2), None, keep.float())
    with pytest.raises(ValueError, match="weights shape"):
        ppo_loss(cur, None, torch.zeros(2), torch.ones(2, 4), keep)
    with pytest.raises(ValueError, match="eps_low"):
        ppo_loss(cur, None, torch.zeros(2), None, keep, eps_low=1.5)
    loss, _ = ppo_loss(cur, None, torch.zeros(2), None, torch.zeros(2, 3, dtype=torch.bool))
    assert loss.item() == 0.0
