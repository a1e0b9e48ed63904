"""Trajectory structure of a batch: tokens -> segments -> turns -> trajectories (docs/algorithm.md, "The two layouts").

Internal helper of ``interq.algo``.  Everything here is index arithmetic on the action mask and the
optional ``traj_id`` / ``turn_idx`` row labels; no Python loop over tokens, segments or rows.

Vocabulary
----------
- *segment*: one action (turn) as laid out in the batch.  Concatenated layout: a maximal run of True
  in a row's action mask.  Per-turn layout: all action tokens of one row (rows with no action token
  are padding and form no segment).
- *unit*: one distinct ``(trajectory, turn)``.  In the concatenated layout every segment is its own
  unit.  In the per-turn layout, rows repeating the same ``(traj_id, turn_idx)`` are duplicates of one
  unit: the unit's statistics are the mean over its duplicate segments (exact for copies), so a
  duplicated turn counts once in any history and all its copies receive the same prefix weight.
- Units are sorted by (trajectory, turn), so a trajectory's units are contiguous and its history is an
  exclusive cumulative sum inside that block.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class Structure:
    action_mask: Tensor  # [B, L] bool
    seg_of_token: Tensor  # [B, L] long, segment id of each action token, S (a dummy id) elsewhere
    num_segments: int  # S
    unit_of_seg: Tensor  # [S] long, unit of each segment
    seg_dup_weight: Tensor  # [S] float64, 1 / (number of segments of its unit)
    num_units: int  # U
    unit_traj: Tensor  # [U] long, dense trajectory index in [0, num_trajs)
    unit_rank: Tensor  # [U] long, 1-based turn number inside its trajectory (t of spec §7)
    unit_first: Tensor  # [U] long, index of the first unit of the same trajectory
    num_trajs: int
    unit_of_token: Tensor  # [B, L] long, unit id of each action token, U (a dummy id) elsewhere
    seg_is_unit: bool  # True when unit_of_seg is the identity (concatenated layout)

    def seg_to_unit_mean(self, seg_values: Tensor) -> Tensor:
        """Mean of a per-segment quantity over the duplicate segments of each unit.  [S] -> [U]"""
        if self.seg_is_unit:
            return seg_values  # [U], unit_of_seg is the identity
        out = seg_values.new_zeros(self.num_units)  # [U]
        return out.index_add_(0, self.unit_of_seg, seg_values * self.seg_dup_weight)  # [U]

    def unit_to_tokens(self, unit_values: Tensor, fill: float = 0.0) -> Tensor:
        """Broadcast a per-unit quantity to its action tokens; ``fill`` elsewhere.  [U] -> [B, L]"""
        ext = torch.cat([unit_values, unit_values.new_full((1,), fill)])  # [U + 1], the dummy id reads ``fill``
        return torch.take(ext, self.unit_of_token)  # [B, L]

    def history_sum(self, unit_values: Tensor) -> Tensor:
        """sum_{k in H_t} x[k], H_t = earlier turns of the same trajectory (spec §3).  [U] -> [U]"""
        incl = torch.cumsum(unit_values, 0)  # [U]
        excl = torch.cat([incl.new_zeros(1), incl[:-1]])  # [U], sum of all units before u in the batch
        return excl - excl[self.unit_first]  # [U], exactly 0 on a trajectory's first turn

    def traj_sum(self, unit_values: Tensor) -> Tensor:
        """Sum of a per-unit quantity over each trajectory.  [U] -> [num_trajs]"""
        out = unit_values.new_zeros(self.num_trajs)  # [num_trajs]
        return out.index_add_(0, self.unit_traj, unit_values)


def _first_of_block(group: Tensor) -> Tensor:
    """For a sorted group label vector, the index of the first element of each element's block."""
    n = group.numel()
    idx = torch.arange(n, device=group.device)  # [n]
    is_first = torch.ones(n, dtype=torch.bool, device=group.device)  # [n]
    if n > 1:
        is_first[1:] = group[1:] != group[:-1]
    return torch.cummax(torch.where(is_first, idx, torch.zeros_like(idx)), 0).values  # [n]


def build_structure(action_mask: Tensor, traj_id: Tensor | None, turn_idx: Tensor | None) -> Structure:
    """Segment/unit/trajectory indices for either layout of spec §5 (inputs already validated)."""
    B, L = action_mask.shape
    dev = action_mask.device
    if traj_id is None:
        # Concatenated layout: segments = maximal runs of True, numbered in row-major order.
        prev = torch.zeros_like(action_mask)  # [B, L]
        prev[:, 1:] = action_mask[:, :-1]
        start = action_mask & ~prev  # [B, L], first token of each segment
        seg = torch.cumsum(start.reshape(-1), 0).reshape(B, L) - 1  # [B, L]
        start_pos = start.nonzero()  # [S, 2] (row, col), row-major = segment order
        S = start_pos.shape[0]
        seg_of_token = torch.where(action_mask, seg, S)  # [B, L]
        unit_traj = start_pos[:, 0]  # [S], the row is the trajectory
        unit_of_seg = torch.arange(S, device=dev)  # [S]
        seg_dup_weight = torch.ones(S, dtype=torch.float64, device=dev)  # [S]
        unit_first = _first_of_block(unit_traj)  # [S], first segment of the same row
        unit_rank = unit_of_seg - unit_first + 1  # [S], 1-based segment number in its row
        return Structure(
            action_mask=action_mask,
            seg_of_token=seg_of_token,
            num_segments=S,
            unit_of_seg=unit_of_seg,
            seg_dup_weight=seg_dup_weight,
            num_units=S,
            unit_traj=unit_traj,
            unit_rank=unit_rank,
            unit_first=unit_first,
            num_trajs=B,
            unit_of_token=seg_of_token,  # [B, L]
            seg_is_unit=True,
        )

    # Per-turn layout: each row with at least one action token is one segment.
    has_action = action_mask.any(dim=1)  # [B]
    seg_of_row = torch.cumsum(has_action.long(), 0) - 1  # [B]
    S = int(has_action.sum())
    seg_of_token = torch.where(action_mask, seg_of_row[:, None].expand(B, L), S)  # [B, L]
    traj_s = traj_id[has_action]  # [S]
    turn_s = turn_idx[has_action]  # [S]
    if S == 0:
        empty = torch.zeros(0, dtype=torch.long, device=dev)
        return Structure(action_mask, seg_of_token, 0, empty, empty.double(), 0, empty, empty, empty, 0, seg_of_token, False)
    traj_vals, traj_dense = torch.unique(traj_s, return_inverse=True)  # [T], [S]
    turn_vals, turn_dense = torch.unique(turn_s, return_inverse=True)  # [K], [S]
    n_turn_vals = turn_vals.numel()
    key = traj_dense * n_turn_vals + turn_dense  # [S], sorts by (trajectory, turn)
    ukeys, unit_of_seg, counts = torch.unique(key, sorted=True, return_inverse=True, return_counts=True)  # [U], [S], [U]
    U = ukeys.numel()
    unit_traj = ukeys // n_turn_vals  # [U]
    unit_first = _first_of_block(unit_traj)  # [U]
    unit_rank = torch.arange(U, device=dev) - unit_first + 1  # [U]
    seg_dup_weight = 1.0 / counts.to(torch.float64)[unit_of_seg]  # [S]
    return Structure(
        action_mask=action_mask,
        seg_of_token=seg_of_token,
        num_segments=S,
        unit_of_seg=unit_of_seg,
        seg_dup_weight=seg_dup_weight,
        num_units=U,
        unit_traj=unit_traj,
        unit_rank=unit_rank,
        unit_first=unit_first,
        num_trajs=traj_vals.numel(),
        unit_of_token=torch.cat([unit_of_seg, unit_of_seg.new_full((1,), U)])[seg_of_token],  # [B, L]
        seg_is_unit=False,
    )
