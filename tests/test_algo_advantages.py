"""interq.algo.advantages: GRPO and GiGPO against loops over groups."""

from __future__ import annotations

import random
import statistics

import pytest
import torch

from interq.algo.advantages import broadcast_to_tokens, gigpo_advantages, group_index, grpo_advantages


def _ref_norm(values, groups, use_std, eps=1e-6):
    out = []
    for i, v in enumerate(values):
        members = [values[j] for j in range(len(values)) if groups[j] == groups[i]]
        if len(members) == 1:
            out.append(0.0)
            continue
        m = sum(members) / len(members)
        out.append((v - m) / (statistics.stdev(members) + eps) if use_std else v - m)
    return out


@pytest.mark.parametrize("use_std", [True, False])
def test_grpo_matches_loop(use_std):
    rnd = random.Random(1)
    for trial in range(5):
        n = rnd.randint(1, 30)
        groups = [f"task-{rnd.randint(0, 5)}" for _ in range(n)]
        rewards = [float(rnd.choice([0, 1, 0.5, -0.1, 2.0])) for _ in range(n)]
        adv, m = grpo_advantages(torch.tensor(rewards), groups, use_std=use_std)
        ref = _ref_norm(rewards, groups, use_std)
        assert adv.tolist() == pytest.approx(ref, abs=1e-5)
        # integer tensor ids give the same result
        ids = torch.tensor([int(g.split("-")[1]) * 17 - 40 for g in groups])
        adv2, _ = grpo_advantages(torch.tensor(rewards), ids, use_std=use_std)
        assert torch.equal(adv, adv2)


def test_grpo_by_hand_and_edge_cases():
    adv, m = grpo_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0, 3.0]), ["a", "a", "a", "a", "b"])
    # group a: mean 0.5, unbiased std sqrt(1/3)
    s = (1 / 3) ** 0.5
    assert adv.tolist() == pytest.approx([0.5 / s, -0.5 / s, -0.5 / s, 0.5 / s, 0.0], rel=1e-5)
    assert m["grpo/singleton_frac"] == pytest.approx(0.5)
    adv, m = grpo_advantages(torch.tensor([1.0, 1.0, 1.0]), [0, 0, 0])
    assert adv.tolist() == [0.0, 0.0, 0.0] and m["grpo/zero_std_group_frac"] == 1.0
    adv, _ = grpo_advantages(torch.tensor([2.0, 0.0]), ["x", "x"], use_std=False)
    assert adv.tolist() == [1.0, -1.0]
    with pytest.raises(ValueError, match="group_ids has 2 entries, expected 3"):
        grpo_advantages(torch.tensor([1.0, 2.0, 3.0]), ["a", "b"])
    with pytest.raises(TypeError, match="group_ids must be an integer tensor"):
        grpo_advantages(torch.tensor([1.0, 2.0]), torch.tensor([0.0, 1.0]))
    with pytest.raises(ValueError, match="rewards contains NaN"):
        grpo_advantages(torch.tensor([float("nan"), 2.0]), [0, 0])


def _ref_gigpo(rewards, eps_ids, steps, groups, anchors, gamma, omega, use_std):
    """Loop reference: per-episode returns, per-anchor-group normalisation."""
    n = len(rewards)
    episodes = sorted(set(eps_ids), key=str)
    # episode returns and their GRPO advantage within the task group
    ep_ret = {e: sum(rewards[i] for i in range(n) if eps_ids[i] == e) for e in episodes}
    ep_grp = {eps_ids[i]: groups[i] for i in range(n)}
    eps_list = list(ep_ret)
    a_e_list = _ref_norm([ep_ret[e] for e in eps_list], [ep_grp[e] for e in eps_list], use_std)
    a_e = dict(zip(eps_list, a_e_list))
    # discounted step returns
    R = [0.0] * n
    for e in episodes:
        idx = sorted([i for i in range(n) if eps_ids[i] == e], key=lambda i: steps[i])
        acc = 0.0
        for i in reversed(idx):
            acc = rewards[i] + gamma * acc
            R[i] = acc
    # anchor groups over (task group, anchor)
    keys = [(groups[i], anchors[i]) for i in range(n)]
    a_s = _ref_norm(R, keys, use_std)
    return [a_e[eps_ids[i]] + omega * a_s[i] for i in range(n)]


@pytest.mark.parametrize("use_std", [True, False])
def test_gigpo_matches_loop_over_anchor_groups(use_std):
    rnd = random.Random(7)
    for trial in range(6):
        rewards, eps_ids, steps, groups, anchors = [], [], [], [], []
        for task in range(rnd.randint(1, 3)):
            for ep in range(rnd.randint(1, 4)):
                T = rnd.randint(1, 6)
                order = list(range(T))
                for t in order:
                    rewards.append(float(rnd.choice([0.0, 0.0, -0.1, 1.0, 10.0])))
                    eps_ids.append(f"t{task}e{ep}")
                    steps.append(t * 2 + 1)  # non-contiguous step numbers
                    groups.append(task)
                    anchors.append(f"You are in room {rnd.randint(0, 2)}." if rnd.random() < 0.8 else f"unique {len(anchors)}")
        perm = list(range(len(rewards)))
        rnd.shuffle(perm)  # steps arrive in any order
        rewards, eps_ids, steps, groups, anchors = ([x[i] for i in perm] for x in (rewards, eps_ids, steps, groups, anchors))
        gamma, omega = rnd.choice([(0.95, 1.0), (0.5, 0.3), (1.0, 2.0)])
        adv, m = gigpo_advantages(torch.tensor(rewards), eps_ids, torch.tensor(steps), groups, anchors, gamma=gamma, omega=omega, use_std=use_std)
        ref = _ref_gigpo(rewards, eps_ids, steps, groups, anchors, gamma, omega, use_std)
        assert adv.tolist() == pytest.approx(ref, abs=2e-5 * max(1.0, max(abs(x) for x in ref)))


def test_gigpo_by_hand():
    # one task, two episodes of two steps; both start in the same state "s0"
    rewards = torch.tensor([0.0, 1.0, 0.0, 0.0])
    eps = ["A", "A", "B", "B"]
    steps = torch.tensor([0, 1, 0, 1])
    anchors = ["s0", "s1", "s0", "s2"]
    adv, _ = gigpo_advantages(rewards, eps, steps, [0, 0, 0, 0], anchors, gamma=0.5, omega=1.0, use_std=False)
    # A_E: returns 1 and 0 -> +0.5 / -0.5.  Step returns: A: 0.5, 1 ; B: 0, 0.
    # anchor s0 = {A0: 0.5, B0: 0} -> +0.25 / -0.25; s1 and s2 singletons -> 0
    assert adv.tolist() == pytest.approx([0.75, 0.5, -0.75, -0.5])
    with pytest.raises(ValueError, match="group_ids must be constant inside an episode"):
        gigpo_advantages(rewards, eps, steps, [0, 1, 0, 0], anchors)
    with pytest.raises(ValueError, match="step_idx repeats"):
        gigpo_advantages(rewards, eps, torch.tensor([0, 0, 0, 1]), [0] * 4, anchors)
    with pytest.raises(ValueError, match="gamma must be in"):
        gigpo_advantages(rewards, eps, steps, [0] * 4, anchors, gamma=1.5)


def test_broadcast_and_group_index():
    mask = torch.tensor([[True, False, True], [False, False, False], [True, True, False]])
    out = broadcast_to_tokens(torch.tensor([1.0, 2.0, -3.0]), mask)
    assert out.tolist() == [[1.0, 0.0, 1.0], [0.0, 0.0, 0.0], [-3.0, -3.0, 0.0]]
    out = broadcast_to_tokens(torch.tensor([5.0, 7.0]), mask, index=torch.tensor([1, 1, 0]))
    assert out.tolist() == [[7.0, 0.0, 7.0], [0.0, 0.0, 0.0], [5.0, 5.0, 0.0]]
    with pytest.raises(ValueError, match="values"):
        broadcast_to_tokens(torch.tensor([1.0]), mask)
    gid, G = group_index(["b", "a", "b", ("x", 1)])
    assert gid.tolist() == [0, 1, 0, 2] and G == 3
    with pytest.raises(TypeError, match="hashable"):
        group_index([[1], [2]])
