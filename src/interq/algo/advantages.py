"""Advantages: GRPO and GiGPO, as pure functions returning ``(advantages, metrics)``.

Group ids and anchor keys
-------------------------
Every ``*_ids`` / ``anchor_keys`` argument accepts either a 1-D integer ``torch.Tensor`` or a sequence
(list, tuple, numpy array) of hashable labels (``int``, ``str`` such as verl's ``uid``, tuples, ...).
Two entries belong to the same group iff their labels are equal.  For GiGPO the anchor key is the raw
observation text of the state (or any hashable / integer fingerprint of it).

Output granularity
------------------
GRPO gives one advantage per episode, GiGPO one per step (turn).  The caller broadcasts them to the
action tokens with ``broadcast_to_tokens`` (``index`` maps rows to episodes / steps when the batch is
laid out differently).

Conventions (each a documented choice)
--------------------------------------
- ``std`` is the unbiased (n - 1) standard deviation of the group, as in verl's GRPO; ``eps = 1e-6``.
- A group of one element gives advantage 0 (nothing to compare with), for GRPO as for GiGPO.
- GiGPO's episode return is the undiscounted sum of the episode's step rewards; the step return is
  ``R_t = sum_{k >= t} gamma^(k - t) r_k`` over the episode's steps ordered by ``step_idx`` (the steps
  present, consecutive ones one discount apart).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

def group_index(ids: Any, name: str = "group_ids", n: int | None = None) -> tuple[Tensor, int]:
    """Dense group index [N] (long, 0..G-1, in order of first appearance for sequences) and G."""
    if isinstance(ids, Tensor):
        if ids.dim() != 1:
            raise ValueError(f"{name} must be 1-D, got shape {tuple(ids.shape)}")
        if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
            raise TypeError(f"{name} must be an integer tensor or a sequence of hashable labels, got dtype {ids.dtype}")
        _, dense = torch.unique(ids, return_inverse=True)
        out = dense.long()
        G = int(dense.max()) + 1 if ids.numel() else 0
    else:
        try:
            labels = list(ids)
        except TypeError:
            raise TypeError(f"{name} must be an integer tensor or a sequence of hashable labels, got {type(ids).__name__}") from None
        table: dict[Any, int] = {}
        try:
            dense_list = [table.setdefault(x if not hasattr(x, "item") else x.item(), len(table)) for x in labels]
        except TypeError:
            raise TypeError(f"{name} entries must be hashable (int, str, tuple), got an unhashable entry") from None
        out, G = torch.tensor(dense_list, dtype=torch.long), len(table)
    if n is not None and out.numel() != n:
        raise ValueError(f"{name} has {out.numel()} entries, expected {n}")
    return out, G


def _check_values(name: str, x: Any) -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a 1-D float torch.Tensor, got {type(x).__name__}")
    if x.dim() != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(x.shape)}")
    if not x.is_floating_point():
        x = x.to(torch.float64)
    if not bool(torch.isfinite(x).all()):
        raise ValueError(f"{name} contains NaN or inf")
    return x.detach().to(torch.float64)


def group_normalize(x: Tensor, gid: Tensor, num_groups: int, *, use_std: bool, eps: float = 1e-6) -> Tensor:
    """(x - mean_group) / (std_group + eps) (or without std); 0 for singleton groups.  [N] -> [N] float64"""
    x = x.to(torch.float64)
    cnt = torch.bincount(gid, minlength=num_groups).to(torch.float64)  # [G]
    mean = torch.zeros(num_groups, dtype=torch.float64, device=x.device).index_add_(0, gid, x) / cnt.clamp(min=1)  # [G]
    dev = x - mean[gid]  # [N]
    if use_std:
        var = torch.zeros(num_groups, dtype=torch.float64, device=x.device).index_add_(0, gid, dev * dev) / (cnt - 1).clamp(min=1)  # [G]
        dev = dev / (var.sqrt()[gid] + eps)  # [N]
    return torch.where(cnt[gid] > 1, dev, torch.zeros_like(dev))  # [N]


def grpo_advantages(rewards: Tensor, group_ids: Any, *, use_std: bool = True, eps: float = 1e-6) -> tuple[Tensor, dict[str, float]]:
    """GRPO (§6): ``A = (R - mean_G) / (std_G + eps)`` (or ``R - mean_G`` when ``use_std=False``).

    rewards [N] (one scalar return per episode); group_ids: N labels, equal for episodes of the same task
    instance.  Returns (advantages [N] float32, metrics).
    """
    r = _check_values("rewards", rewards)  # [N]
    gid, G = group_index(group_ids, "group_ids", r.numel())
    gid = gid.to(r.device)
    adv = group_normalize(r, gid, G, use_std=use_std, eps=eps)  # [N]
    return adv.to(torch.float32), _group_metrics("grpo", r, gid, G, adv)


def _group_metrics(prefix: str, x: Tensor, gid: Tensor, G: int, adv: Tensor) -> dict[str, float]:
    if x.numel() == 0:
        return {f"{prefix}/adv_mean": 0.0, f"{prefix}/adv_std": 0.0, f"{prefix}/singleton_frac": 0.0, f"{prefix}/zero_std_group_frac": 0.0, f"{prefix}/num_groups": 0.0}
    cnt = torch.bincount(gid, minlength=G)  # [G]
    mx = torch.full((G,), -torch.inf, dtype=torch.float64, device=x.device).scatter_reduce_(0, gid, x, "amax")  # [G]
    mn = torch.full((G,), torch.inf, dtype=torch.float64, device=x.device).scatter_reduce_(0, gid, x, "amin")  # [G]
    multi = cnt > 1
    zero_std = ((mx == mn) & multi).sum() / multi.sum().clamp(min=1)
    return {
        f"{prefix}/adv_mean": float(adv.mean()),
        f"{prefix}/adv_std": float(adv.std(unbiased=False)),
        f"{prefix}/singleton_frac": float((~multi).double().mean()),
        f"{prefix}/zero_std_group_frac": float(zero_std),
        f"{prefix}/num_groups": float(G),
    }


def discounted_returns(step_rewards: Tensor, episode: Tensor, position: Tensor, num_episodes: int, gamma: float) -> Tensor:
    """R_t = sum_{k >= t} gamma^(k - t) r_k inside each episode.  All [M]; position = 0-based rank in the episode."""
    T = int(position.max()) + 1 if position.numel() else 0
    grid = torch.zeros(num_episodes, T + 1, dtype=torch.float64, device=step_rewards.device)  # [E, T+1]
    grid[episode, position] = step_rewards
    # backward scan over step positions (T = steps per episode, tens), vectorised over episodes
    for t in range(T - 1, -1, -1):
        grid[:, t] += gamma * grid[:, t + 1]
    return grid[episode, position]  # [M]


def gigpo_advantages(
    step_rewards: Tensor,
    episode_ids: Any,
    step_idx: Tensor,
    group_ids: Any,
    anchor_keys: Any,
    *,
    gamma: float = 0.95,
    omega: float = 1.0,
    use_std: bool = True,
    eps: float = 1e-6,
) -> tuple[Tensor, dict[str, float]]:
    """GiGPO (§6): ``A = A_E + omega * A_S`` per step.

    - step_rewards [M]: reward of every step (turn) of every episode;
    - episode_ids: M labels, the episode of each step; step_idx [M] int: order of the step in its episode;
    - group_ids: M labels, the task group (task instance) of each step (constant inside an episode);
    - anchor_keys: M labels, the anchor state of each step (raw observation text or a fingerprint).

    A_E: GRPO over the episodes of a task group on the undiscounted episode return (std per ``use_std``).
    A_S: steps of the same task group with equal anchor keys form an anchor group;
    ``A_S = (R_t - mean) / F`` with ``F = std + eps`` (``use_std``) or 1; singleton anchor groups give 0.
    Returns (step advantages [M] float32 in input order, metrics).
    """
    r = _check_values("step_rewards", step_rewards)  # [M]
    M_ = r.numel()
    if not isinstance(step_idx, Tensor) or step_idx.dim() != 1 or step_idx.is_floating_point() or step_idx.dtype == torch.bool:
        raise TypeError("step_idx must be a 1-D integer torch.Tensor [M]")
    if step_idx.numel() != M_:
        raise ValueError(f"step_idx has {step_idx.numel()} entries, expected {M_}")
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")
    ep, E = group_index(episode_ids, "episode_ids", M_)
    grp, G = group_index(group_ids, "group_ids", M_)
    anc, _ = group_index(anchor_keys, "anchor_keys", M_)
    ep, grp, anc = ep.to(r.device), grp.to(r.device), anc.to(r.device)
    if M_ == 0:
        return torch.zeros(0, device=r.device), {}
    # task group of each episode; an episode must not span two groups
    ep_grp = torch.full((E,), -1, dtype=torch.long, device=r.device).scatter_(0, ep, grp)  # [E]
    if bool((ep_grp[ep] != grp).any()):
        raise ValueError("group_ids must be constant inside an episode (an episode belongs to one task group)")
    # rank of each step inside its episode, by step_idx
    key = ep * (int(step_idx.max() - step_idx.min()) + 1) + (step_idx.to(r.device) - step_idx.min())  # [M], (episode, step)
    if torch.unique(key).numel() != M_:
        raise ValueError("step_idx repeats inside an episode")
    order = torch.argsort(key, stable=True)  # [M]
    first = torch.zeros(E, dtype=torch.long, device=r.device)
    cnt = torch.bincount(ep, minlength=E)  # [E]
    first[1:] = torch.cumsum(cnt, 0)[:-1]
    pos = torch.empty_like(order)
    pos[order] = torch.arange(M_, device=r.device) - first[ep[order]]  # [M]
    # episode level
    ep_return = torch.zeros(E, dtype=torch.float64, device=r.device).index_add_(0, ep, r)  # [E]
    a_e = group_normalize(ep_return, ep_grp, G, use_std=use_std, eps=eps)  # [E]
    # step level: anchor groups = (task group, anchor key)
    R_t = discounted_returns(r, ep, pos, E, gamma)  # [M]
    _, sgid = torch.unique(torch.stack([grp, anc], 1), dim=0, return_inverse=True)  # [M]
    S = int(sgid.max()) + 1
    a_s = group_normalize(R_t, sgid, S, use_std=use_std, eps=eps)  # [M]
    adv = a_e[ep] + omega * a_s  # [M]
    sizes = torch.bincount(sgid, minlength=S)  # [S]
    metrics = {
        "gigpo/episode_adv_std": float(a_e.std(unbiased=False)),
        "gigpo/step_adv_std": float(a_s.std(unbiased=False)),
        "gigpo/adv_mean": float(adv.mean()),
        "gigpo/anchor_group_size_mean": float(sizes.double().mean()),
        "gigpo/anchor_singleton_step_frac": float((sizes[sgid] == 1).double().mean()),
        "gigpo/num_anchor_groups": float(S),
    }
    return adv.to(torch.float32), metrics


def broadcast_to_tokens(values: Tensor, action_mask: Tensor, index: Tensor | None = None) -> Tensor:
    """Per-row value on every action token of the row, 0 elsewhere.

    values [N]; action_mask [R, L] bool; ``index`` [R] long maps each row to its entry of ``values``
    (default: row r takes values[r], N == R).  Returns [R, L] float32.
    """
    if action_mask.dtype != torch.bool or action_mask.dim() != 2:
        raise TypeError(f"action_mask must be a [R, L] bool tensor, got dtype {action_mask.dtype} shape {tuple(action_mask.shape)}")
    v = values if index is None else values[index]  # [R]
    if v.shape != (action_mask.shape[0],):
        raise ValueError(f"values (after index) must have shape [R] = ({action_mask.shape[0]},), got {tuple(v.shape)}")
    v = v.detach().to(torch.float32)
    return torch.where(action_mask, v[:, None], v.new_zeros(()))  # [R, L]
