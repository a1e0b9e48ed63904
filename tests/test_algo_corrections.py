"""interq.algo.corrections against a naive Python-loop reference and the properties of docs/algorithm.md."""

from __future__ import annotations

import math
import random

import pytest
import torch

from interq.algo.corrections import (
    METHODS,
    Correction,
    CorrectionConfig,
    CorrectionMethod,
    _prepare,
    compute_correction,
    interq_prefix_logweights,
)
from interq.algo.metrics import turn_curve

# ---------------------------------------------------------------------------------------------------
# Naive reference: plain Python loops over trajectories, turns and tokens, straight from the spec.


def _ref(method, p, b, mask, traj_id=None, turn_idx=None, cfg=CorrectionConfig()):
    """Returns (weights [B][L] list, keep [B][L] list, Lambda [B][L] list or None)."""
    B, L = p.shape
    P, Bh, Mk = p.double().tolist(), b.double().tolist(), mask.tolist()
    # trajectories: key -> {turn key -> [segments]}, segment = list of (row, col)
    trajs: dict = {}
    if traj_id is None:
        for r in range(B):
            segs, cur = [], None
            for c in range(L):
                if Mk[r][c]:
                    if cur is None:
                        cur = []
                        segs.append(cur)
                    cur.append((r, c))
                else:
                    cur = None
            trajs[r] = {i: [s] for i, s in enumerate(segs)}
    else:
        for r in range(B):
            toks = [(r, c) for c in range(L) if Mk[r][c]]
            if toks:
                trajs.setdefault(int(traj_id[r]), {}).setdefault(int(turn_idx[r]), []).append(toks)

    def ok(r, c):
        return math.isfinite(P[r][c]) and math.isfinite(Bh[r][c])

    def dlt(r, c):
        return min(max(P[r][c] - Bh[r][c], -20.0), 20.0)

    def seg_stats(seg, uniform):
        ds = [dlt(r, c) for r, c in seg if ok(r, c)]
        D = sum(ds)
        if not ds or uniform:
            return D, 1.0, len(ds)
        mx = max(ds)
        rs = [math.exp(d - mx) for d in ds]
        return D, sum(rs) ** 2 / (len(ds) * sum(x * x for x in rs)), len(ds)

    W = [[0.0] * L for _ in range(B)]
    K = [[False] * L for _ in range(B)]
    LAM = [[0.0] * L for _ in range(B)] if method in ("interq", "interq_uniform", "prefix_is") else None
    C = cfg.tis_cap

    def wtok(r, c):
        return min(math.exp(dlt(r, c)), C) if cfg.token_correction else 1.0

    for tr in trajs.values():
        turns = sorted(tr)
        stats = {}
        for t in turns:
            ss = [seg_stats(s, method == "interq_uniform") for s in tr[t]]
            nd = len(ss)
            stats[t] = (
                sum(x[0] for x in ss) / nd,  # D
                sum(x[1] * abs(x[0]) for x in ss) / nd,  # s|D|
                sum(x[1] * x[0] for x in ss) / nd,  # sD
                sum(x[2] for x in ss) / nd,  # n
            )
        traj_D = sum(stats[t][0] for t in turns)
        traj_n = sum(stats[t][3] for t in turns)
        for j, t in enumerate(turns):
            hist = turns[:j]
            raw = sum(stats[k][0] for k in hist)
            demand = sum(stats[k][1] for k in hist)
            numer = sum(stats[k][2] for k in hist)
            Bud = cfg.budget
            kappa = 1.0 if demand <= Bud else Bud / demand
            Lam = kappa * numer
            for seg in tr[t]:
                for r, c in seg:
                    if LAM is not None:
                        LAM[r][c] = Lam if method != "prefix_is" else min(raw, math.log(cfg.prefix_cap))
                    if not ok(r, c):
                        continue
                    d = dlt(r, c)
                    keep, w = True, 1.0
                    if method == "tis":
                        w = min(math.exp(d), C)
                    elif method == "icepop":
                        w = math.exp(d)
                        keep = cfg.icepop_bounds[0] <= w <= cfg.icepop_bounds[1]
                    elif method == "seq_is":
                        w = min(math.exp(traj_D), C)
                    elif method == "geo_mask":
                        w = wtok(r, c)
                        g = math.exp(traj_D / traj_n)
                        keep = cfg.geo_bounds[0] <= g <= cfg.geo_bounds[1]
                    elif method == "prefix_is":
                        w = min(math.exp(raw), cfg.prefix_cap) * wtok(r, c)
                    elif method in ("interq", "interq_uniform"):
                        w = math.exp(Lam) * wtok(r, c)
                    K[r][c] = keep
                    W[r][c] = w if keep else 0.0
    if cfg.normalize:
        kept = [W[r][c] for r in range(B) for c in range(L) if K[r][c]]
        if kept:
            mu = sum(kept) / len(kept)
            W = [[x / mu for x in row] for row in W]
    return W, K, LAM


# ---------------------------------------------------------------------------------------------------
# Random batches


def _random_concat(seed, B=5, L=24, scale=0.3, drift=0.0, nonfinite=0.0):
    """Concatenated batch with ragged trajectories, single-token segments and all-padding rows."""
    g = torch.Generator().manual_seed(seed)
    rnd = random.Random(seed)
    mask = torch.zeros(B, L, dtype=torch.bool)
    for r in range(B):
        if rnd.random() < 0.15:
            continue  # all-padding row
        c = rnd.randint(0, 3)
        while c < L:
            n = rnd.choice([1, 1, 2, 3, 5])
            mask[r, c : c + n] = True
            c += n + rnd.randint(1, 4)
    p = -torch.rand(B, L, generator=g) * 3  # [B, L]
    b = p - (torch.randn(B, L, generator=g) * scale + drift)  # [B, L]
    if nonfinite:
        bad = torch.rand(B, L, generator=g) < nonfinite
        kinds = torch.randint(0, 3, (B, L), generator=g)
        vals = torch.tensor([math.nan, math.inf, -math.inf])[kinds]
        which = torch.rand(B, L, generator=g) < 0.5
        p = torch.where(bad & which, vals, p)
        b = torch.where(bad & ~which, vals, b)
    return p, b, mask


def _to_per_turn(p, b, mask, seed, dup=0, empty_rows=1):
    """The same episodes as per-turn rows: one row per segment, shuffled, with non-contiguous turn_idx,
    arbitrary traj ids, ``dup`` duplicated rows and ``empty_rows`` padding rows.  Returns the per-turn
    tensors and, per row, the list of (source row, source col) of its tokens (for mapping back)."""
    rnd = random.Random(seed)
    B, L = mask.shape
    rows = []
    for r in range(B):
        c, k = 0, 0
        while c < L:
            if mask[r, c]:
                e = c
                while e < L and mask[r, e]:
                    e += 1
                rows.append((r, k, list(range(c, e))))
                k += 1
                c = e
            else:
                c += 1
    rows += [rows[rnd.randrange(len(rows))] for _ in range(dup)] if rows else []
    rows += [(None, None, [])] * empty_rows
    rnd.shuffle(rows)
    Lp = L + 3
    R = len(rows)
    pp = torch.full((R, Lp), -1.0)
    bb = torch.full((R, Lp), -1.0)
    mm = torch.zeros(R, Lp, dtype=torch.bool)
    tid = torch.zeros(R, dtype=torch.long)
    tix = torch.zeros(R, dtype=torch.long)
    src = []
    for i, (r, k, cols) in enumerate(rows):
        off = rnd.randint(0, 3)
        for j, c in enumerate(cols):
            pp[i, off + j] = p[r, c]
            bb[i, off + j] = b[r, c]
            mm[i, off + j] = True
        tid[i] = 1000 - 7 * (r if r is not None else 99)
        tix[i] = 3 * (k if k is not None else 0) + 2
        src.append([(off + j, r, c) for j, c in enumerate(cols)])
    return pp, bb, mm, tid, tix, src


def _close(a, b, tol=2e-5):
    a = torch.as_tensor(a, dtype=torch.float64)
    b = torch.as_tensor(b, dtype=torch.float64)
    assert a.shape == b.shape
    err = (a - b).abs().max().item() if a.numel() else 0.0
    assert err <= tol * (1 + b.abs().max().item() if b.numel() else 1), f"max abs err {err}\n got {a}\n ref {b}"


CFGS = [
    CorrectionConfig(),
    CorrectionConfig(budget=0.1, tis_cap=1.5, icepop_bounds=(0.8, 1.25), geo_bounds=(0.95, 1.05), prefix_cap=3.0),
    CorrectionConfig(budget=2.0, normalize=True),
    CorrectionConfig(budget=0.25, token_correction=False),
]


# ---------------------------------------------------------------------------------------------------
# Reference sweeps


@pytest.mark.parametrize("method", METHODS)
def test_concat_matches_naive_reference(method):
    for seed in range(6):
        cfg = CFGS[seed % len(CFGS)]
        p, b, mask = _random_concat(seed, scale=0.3 + 0.2 * (seed % 3), drift=0.05 * seed, nonfinite=0.05 if seed % 2 else 0.0)
        out = compute_correction(method, p, b, mask, config=cfg)
        W, K, LAM = _ref(method, p, b, mask, cfg=cfg)
        assert torch.equal(out.keep_mask, torch.tensor(K)), (method, seed)
        _close(out.weights, W)
        assert out.weights.dtype == torch.float32 and out.keep_mask.dtype == torch.bool
        if LAM is not None:
            _close(out.lambda_, LAM)


@pytest.mark.parametrize("method", METHODS)
def test_per_turn_matches_naive_reference_with_duplicates(method):
    for seed in range(4):
        cfg = CFGS[seed % len(CFGS)]
        p, b, mask = _random_concat(100 + seed, nonfinite=0.05 if seed % 2 else 0.0, drift=0.1)
        pp, bb, mm, tid, tix, _ = _to_per_turn(p, b, mask, seed, dup=3, empty_rows=2)
        out = compute_correction(method, pp, bb, mm, traj_id=tid, turn_idx=tix, config=cfg)
        W, K, LAM = _ref(method, pp, bb, mm, tid, tix, cfg=cfg)
        assert torch.equal(out.keep_mask, torch.tensor(K))
        _close(out.weights, W)
        if LAM is not None:
            _close(out.lambda_, LAM)


def _concat_view(out_pt, src, shape):
    """Map per-turn per-token outputs back to the concatenated positions."""
    w = torch.zeros(shape)
    k = torch.zeros(shape, dtype=torch.bool)
    for i, toks in enumerate(src):
        for j, r, c in toks:
            w[r, c] = out_pt.weights[i, j]
            k[r, c] = out_pt.keep_mask[i, j]
    return w, k


@pytest.mark.parametrize("method", METHODS)
def test_layouts_give_identical_results(method):
    """§5 / property 6: the same episodes, concatenated or as shuffled per-turn rows, give the same
    weights, keep-mask and turn curves (duplicated rows do not change anything)."""
    for seed in range(3):
        p, b, mask = _random_concat(200 + seed, B=6, drift=0.15, nonfinite=0.03 * seed)
        cfg = CFGS[seed % len(CFGS)]
        ref = compute_correction(method, p, b, mask, config=CorrectionConfig(budget=cfg.budget, tis_cap=cfg.tis_cap))
        for dup in (0, 4):
            pp, bb, mm, tid, tix, src = _to_per_turn(p, b, mask, seed + dup, dup=dup)
            out = compute_correction(method, pp, bb, mm, traj_id=tid, turn_idx=tix, config=CorrectionConfig(budget=cfg.budget, tis_cap=cfg.tis_cap))
            w, k = _concat_view(out, src, mask.shape)
            assert torch.equal(k, ref.keep_mask)
            _close(w, ref.weights, 1e-6)
            for curve in ("abs_delta_mean", "abs_prefix_logratio", "abs_Lambda"):
                _close(turn_curve(out.metrics, curve), turn_curve(ref.metrics, curve), 1e-9)
            if dup == 0:
                for key in ("mismatch/k1", "mismatch/nonfinite_frac", "weights/mean", "weights/ess", "weights/keep_frac"):
                    assert out.metrics[key] == pytest.approx(ref.metrics[key], abs=1e-9), key


def test_duplicated_rows_get_identical_weights_and_count_once():
    p, b, mask = _random_concat(7, B=4, drift=0.3)
    pp, bb, mm, tid, tix, _ = _to_per_turn(p, b, mask, 7, dup=0, empty_rows=0)
    base = compute_correction("interq", pp, bb, mm, traj_id=tid, turn_idx=tix)
    # duplicate every row twice and shuffle
    perm = torch.randperm(3 * pp.shape[0])
    idx = torch.arange(pp.shape[0]).repeat(3)[perm]
    out = compute_correction("interq", pp[idx], bb[idx], mm[idx], traj_id=tid[idx], turn_idx=tix[idx])
    _close(out.weights, base.weights[idx], 1e-7)
    _close(out.lambda_, base.lambda_[idx], 1e-7)


def test_row_order_and_padding_invariance():
    p, b, mask = _random_concat(11, drift=0.2, nonfinite=0.05)
    base = compute_correction("interq", p, b, mask)
    # shuffled rows (concatenated layout)
    perm = torch.randperm(p.shape[0])
    out = compute_correction("interq", p[perm], b[perm], mask[perm])
    _close(out.weights, base.weights[perm], 0)
    # extra padding columns (left and right) and an extra all-padding row; garbage off the mask
    B, L = p.shape
    P = torch.full((B + 1, L + 5), math.nan)
    Bh = torch.full((B + 1, L + 5), 3.0)
    Mk = torch.zeros(B + 1, L + 5, dtype=torch.bool)
    P[:B, 2 : L + 2], Bh[:B, 2 : L + 2], Mk[:B, 2 : L + 2] = p, b, mask
    out = compute_correction("interq", P, Bh, Mk)
    _close(out.weights[:B, 2 : L + 2], base.weights, 0)
    assert out.weights[B].abs().sum() == 0 and not out.keep_mask[B].any()
    assert out.metrics["mismatch/nonfinite_frac"] == pytest.approx(base.metrics["mismatch/nonfinite_frac"])


# ---------------------------------------------------------------------------------------------------
# §3 properties


def _hand_case(sign):
    """One trajectory, four segments; the token log-ratios delta = proximal - behavior are
    seg 1: [0, 1] -> D = 1,    r = [e^-1, 1], s = (1 + e^-1)^2 / (2 (1 + e^-2)) = 0.8240271368
    seg 2: [-0.5] -> D = -0.5, s = 1 (one token)
    seg 3: [0.2, 0.2, 0.2] -> D = 0.6, s = 1 (one shared ratio)
    seg 4: [0.3] (its own delta never enters its own prefix weight)
    ``sign=-1`` flips every delta: D flips, s is unchanged (r = exp(delta - max) is [1, e^-1])."""
    mask = torch.tensor([[1, 1, 0, 1, 0, 0, 1, 1, 1, 0, 1]], dtype=torch.bool)
    delta = torch.tensor([[0.0, 1.0, 0.0, -0.5, 0.0, 0.0, 0.2, 0.2, 0.2, 0.0, 0.3]]) * sign
    b = torch.full((1, 11), -1.5)
    return b + delta, b, mask


S1 = 0.8240271368  # support of segment 1 (see _hand_case)
# kappa[t] and Lambda[t] for t = 2, 3, 4 from the §3 closed form, worked by hand:
#   demand[2] = s1|D1| = 0.82403            sum_{k<2} s D = 0.82403
#   demand[3] = 0.82403 + 0.5 = 1.32403     sum_{k<3} s D = 0.82403 - 0.5 = 0.32403
#   demand[4] = 1.32403 + 0.6 = 1.92403     sum_{k<4} s D = 0.32403 + 0.6 = 0.92403
HAND = {  # budget: ([kappa2, kappa3, kappa4], [Lambda2, Lambda3, Lambda4])
    0.5: ([0.5 / 0.8240271368, 0.5 / 1.3240271368, 0.5 / 1.9240271368],
          [0.5, 0.5 * 0.3240271368 / 1.3240271368, 0.5 * 0.9240271368 / 1.9240271368]),  # 0.5, 0.12236, 0.24013
    1.0: ([1.0, 1.0 / 1.3240271368, 1.0 / 1.9240271368],
          [0.8240271368, 0.3240271368 / 1.3240271368, 0.9240271368 / 1.9240271368]),  # 0.82403, 0.24473, 0.48026
    2.0: ([1.0, 1.0, 1.0], [0.8240271368, 0.3240271368, 0.9240271368]),  # the budget never binds
    0.0: ([0.0, 0.0, 0.0], [0.0, 0.0, 0.0]),
}
SEG_COLS = [[0, 1], [3], [6, 7, 8], [10]]


@pytest.mark.parametrize("budget", sorted(HAND))
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_kappa_and_lambda_equal_the_closed_form_on_a_hand_computed_case(budget, sign):
    """The budget arithmetic by hand (``|Lambda| <= B`` alone holds whatever kappa is, the code clamps Lambda)."""
    p, b, mask = _hand_case(sign)
    kappa, lam = HAND[budget]
    assert _prepare(p.double(), b.double(), mask, None, None).support().tolist()[0] == pytest.approx(S1, abs=1e-9)
    out = interq_prefix_logweights(p, b, mask, budget)  # [1, L]
    want = [0.0] + [sign * v for v in lam]  # Lambda of the first segment is 0
    for t, cols in enumerate(SEG_COLS):
        for c in cols:
            assert out[0, c].item() == pytest.approx(want[t], abs=1e-6), f"segment {t + 1}, budget {budget}"
    assert (out[~mask] == 0).all()
    # kappa itself: the turns' parts (Lambda = kappa * sum_{k<t} s D, before the rounding clamp)
    from interq.algo.corrections import _interq_turns

    parts = _interq_turns(_prepare(p.double(), b.double(), mask, None, None), float(budget), False)
    assert parts.kappa.tolist()[1:] == pytest.approx(kappa, abs=1e-6)  # float32 inputs (0.2)
    assert parts.kappa.tolist()[0] == 1.0  # demand 0 <= B: kappa 1 (including B = 0)
    # a sign error in D, a dropped support or the present segment in its own history moves a value by > 1e-2
    wrong = [sign * v for v in HAND[2.0][1]]
    if budget < 2.0:
        assert any(abs(out[0, SEG_COLS[t + 1][0]].item() - w) > 1e-2 for t, w in enumerate(wrong))


def test_property1_lambda_within_budget_and_first_segment_zero():
    for seed in range(8):
        p, b, mask = _random_concat(300 + seed, B=6, L=40, scale=1.5, drift=0.5 * (seed - 4))
        for budget in (0.0, 0.1, 0.5, 2.0):
            lam = interq_prefix_logweights(p, b, mask, budget)
            # against the naive loop of the closed form, not only the bound (the code clamps Lambda to [-B, B])
            ref = _ref("interq", p, b, mask, cfg=CorrectionConfig(budget=budget))[2]
            torch.testing.assert_close(lam.double(), torch.tensor(ref, dtype=torch.float64), rtol=1e-5, atol=1e-6)
            assert lam.abs().max().item() <= budget + 1e-6
            first = mask & ~torch.cat([torch.zeros(6, 1, dtype=torch.bool), mask[:, :-1]], 1)
            first_seg = first.cumsum(1) == 1
            assert (lam[mask & first_seg] == 0).all()
            assert (lam[~mask] == 0).all()
        # the budget binds: with a big drift the raw prefix log-ratio exceeds B but Lambda does not
        c = compute_correction("interq", p, b, mask, config=CorrectionConfig(budget=0.1))
        assert max(turn_curve(c.metrics, "abs_Lambda")) <= 0.1 + 1e-9


def test_property2_zero_budget_reduces_to_token_correction():
    p, b, mask = _random_concat(5, drift=0.4, nonfinite=0.05)
    for m in ("interq", "interq_uniform"):
        out = compute_correction(m, p, b, mask, config=CorrectionConfig(budget=0.0))
        tis = compute_correction("tis", p, b, mask)
        assert torch.equal(out.weights, tis.weights)
        assert (out.lambda_ == 0).all()


def test_property3_infinite_budget_uniform_support_is_full_prefix_is():
    for seed in range(4):
        p, b, mask = _random_concat(400 + seed, drift=0.3)
        lam = interq_prefix_logweights(p, b, mask, math.inf, uniform_support=True)
        st = _prepare(p.double(), b.double(), mask, None, None)
        raw = st.st.unit_to_tokens(st.st.history_sum(st.seg_D))  # sum_{k<t} D[k] per token
        _close(lam, raw, 1e-6)
        # and with a hand loop
        for r in range(p.shape[0]):
            acc, prev, cur = 0.0, False, 0.0
            for c in range(p.shape[1]):
                if mask[r, c]:
                    if not prev:
                        acc += cur
                        cur = 0.0
                    assert lam[r, c].item() == pytest.approx(acc, abs=1e-5)
                    cur += (p[r, c] - b[r, c]).item()
                prev = bool(mask[r, c])
        # the same with interq when every segment has s = 1 (constant delta inside each segment)
        d = torch.full_like(p, 0.0)
        runs = (mask & ~torch.cat([torch.zeros(p.shape[0], 1, dtype=torch.bool), mask[:, :-1]], 1)).cumsum(1)
        d = torch.where(mask, 0.05 * runs.double().sin().float() * (seed + 1), d)
        lam2 = interq_prefix_logweights(p, p - d, mask, math.inf)
        lam3 = interq_prefix_logweights(p, p - d, mask, math.inf, uniform_support=True)
        _close(lam2, lam3, 1e-6)


def test_support_closed_forms():
    # equal ratios -> 1; one dominating token of n -> about 1/n; one-token segment -> 1
    mask = torch.ones(1, 8, dtype=torch.bool)
    p = torch.zeros(1, 8)
    s = _prepare(p.double(), (p - 0.3).double(), mask, None, None).support()
    assert s.item() == pytest.approx(1.0)
    d = torch.tensor([[15.0] + [0.0] * 7])
    s = _prepare(d.double(), torch.zeros(1, 8).double(), mask, None, None).support()
    assert s.item() == pytest.approx(1 / 8, rel=1e-4)
    # two tokens with ratios 1 and e^-1: s = (1 + e^-1)^2 / (2 (1 + e^-2))
    d = torch.tensor([[0.0, -1.0]])
    s = _prepare(d.double(), torch.zeros(1, 2).double(), torch.ones(1, 2, dtype=torch.bool), None, None).support()
    e = math.exp(-1)
    assert s.item() == pytest.approx((1 + e) ** 2 / (2 * (1 + e * e)), rel=1e-12)
    one = torch.zeros(1, 3, dtype=torch.bool)
    one[0, 1] = True
    s = _prepare(torch.tensor([[0.0, 4.0, 0.0]]).double(), torch.zeros(1, 3).double(), one, None, None).support()
    assert s.item() == 1.0


def test_property4_scaling_a_segments_ratios_leaves_its_support_unchanged():
    """Multiplying every token ratio exp(delta) of one earlier segment by c > 0 (adding log c to its
    deltas) leaves its support s unchanged, while |D| and the demand change accordingly.  (The spec's
    wording "scaling all delta" is read as scaling the ratios: scaling delta itself changes s, see the
    report.)"""
    p, b, mask = _random_concat(9, B=3, L=30, scale=0.5)
    base = _prepare(p.double(), b.double(), mask, None, None)
    seg0 = base.st.seg_of_token == 1  # the second segment of the batch
    for c in (0.3, 2.0, 7.0):
        b2 = torch.where(seg0, b - math.log(c), b)  # delta -> delta + log c on that segment
        other = _prepare(p.double(), b2.double(), mask, None, None)
        _close(other.support(), base.support(), 1e-10)
        n = seg0.sum().item()
        assert other.seg_D[1].item() == pytest.approx(base.seg_D[1].item() + n * math.log(c), abs=1e-4)


def test_property5_weights_depend_only_on_logprobs_mask_structure():
    p, b, mask = _random_concat(13)
    a = compute_correction("interq", p, b, mask)
    # changing values off the action mask changes nothing; the function is deterministic
    p2 = torch.where(mask, p, torch.randn_like(p) * 100)
    b2 = torch.where(mask, b, torch.full_like(b, math.nan))
    c = compute_correction("interq", p2, b2, mask)
    assert torch.equal(a.weights, c.weights) and torch.equal(a.keep_mask, c.keep_mask)
    assert a.metrics == c.metrics


def test_property7_no_gradient_through_weights():
    p, b, mask = _random_concat(17)
    p = p.clone().requires_grad_(True)
    b = b.clone().requires_grad_(True)
    for m in METHODS:
        out = compute_correction(m, p, b, mask)
        assert not out.weights.requires_grad and out.weights.grad_fn is None
    assert not interq_prefix_logweights(p, b, mask, 0.5).requires_grad


def test_history_is_the_past_not_the_present():
    """Off-by-one guard: a turn's own mismatch never enters its own prefix weight."""
    mask = torch.zeros(1, 9, dtype=torch.bool)
    mask[0, [0, 1, 4, 5, 6, 8]] = True  # turns: {0,1}, {4,5,6}, {8}
    p = torch.zeros(1, 9)
    b = torch.zeros(1, 9)
    b[0, 0:2] = -0.1  # turn 1 delta = +0.1 each -> D1 = 0.2
    b[0, 4:7] = 0.2  # turn 2 delta = -0.2 each -> D2 = -0.6
    b[0, 8] = -5.0  # turn 3: its own large delta must not matter to itself
    lam = interq_prefix_logweights(p, b, mask, math.inf)
    assert lam[0, :2].tolist() == [0.0, 0.0]
    assert lam[0, 4:7].tolist() == pytest.approx([0.2] * 3, abs=1e-6)
    assert lam[0, 8].item() == pytest.approx(-0.4, abs=1e-6)
    # budget 0.3: turn 3 demand = 0.2 + 0.6 = 0.8 -> kappa = 0.375 -> Lambda = 0.375 * (-0.4) = -0.15
    lam = interq_prefix_logweights(p, b, mask, 0.3)
    assert lam[0, 4].item() == pytest.approx(0.2, abs=1e-6)
    assert lam[0, 8].item() == pytest.approx(-0.15, abs=1e-6)
    w = compute_correction("prefix_is", p, b, mask).weights
    assert w[0, 8].item() == pytest.approx(math.exp(-0.4) * 2.0, rel=1e-5)  # token TIS capped at C=2


# ---------------------------------------------------------------------------------------------------
# Non-finite inputs, metrics, edge cases


def test_nonfinite_tokens_dropped_and_counted():
    p, b, mask = _random_concat(21, nonfinite=0.0)
    nf = torch.zeros_like(mask)
    idx = mask.nonzero()[:5]
    nf[idx[:, 0], idx[:, 1]] = True
    p2 = p.clone()
    p2[idx[0, 0], idx[0, 1]] = math.nan
    p2[idx[1, 0], idx[1, 1]] = math.inf
    b2 = b.clone()
    b2[idx[2, 0], idx[2, 1]] = -math.inf
    b2[idx[3, 0], idx[3, 1]] = math.nan
    p2[idx[4, 0], idx[4, 1]] = -math.inf
    for m in METHODS:
        out = compute_correction(m, p2, b2, mask)
        assert torch.isfinite(out.weights).all()
        assert not out.keep_mask[nf].any()
        assert (out.weights[nf] == 0).all()
        assert out.metrics["mismatch/nonfinite_frac"] == pytest.approx(5 / mask.sum().item())
        assert all(math.isfinite(v) for v in out.metrics.values())


def test_all_nonfinite_and_empty_batches_do_not_raise():
    p = torch.full((2, 5), math.nan)
    b = torch.zeros(2, 5)
    mask = torch.ones(2, 5, dtype=torch.bool)
    for m in METHODS:
        out = compute_correction(m, p, b, mask)
        assert not out.keep_mask.any() and (out.weights == 0).all()
        assert out.metrics["mismatch/nonfinite_frac"] == 1.0
        out = compute_correction(m, b, b, torch.zeros(2, 5, dtype=torch.bool))
        assert out.metrics["weights/keep_frac"] == 0.0
        out = compute_correction(m, b, b, torch.zeros(2, 5, dtype=torch.bool), traj_id=torch.tensor([1, 2]), turn_idx=torch.tensor([0, 0]))
        assert not out.keep_mask.any()
        out = compute_correction(m, torch.zeros(0, 5), torch.zeros(0, 5), torch.zeros(0, 5, dtype=torch.bool))
        assert out.weights.shape == (0, 5)


def test_metrics_values_by_hand():
    mask = torch.tensor([[True, True, False, True]])
    p = torch.tensor([[0.0, 0.0, 0.0, 0.0]])
    b = torch.tensor([[-0.5, 0.5, 9.0, 0.0]])  # delta = 0.5, -0.5, (off), 0
    out = compute_correction("tis", p, b, mask)
    m = out.metrics
    d = [0.5, -0.5, 0.0]
    assert m["mismatch/k1"] == pytest.approx(sum(-x for x in d) / 3)
    assert m["mismatch/k3"] == pytest.approx(sum(math.exp(x) - x - 1 for x in d) / 3)
    assert m["mismatch/chi2_token"] == pytest.approx(sum((math.exp(x) - 1) ** 2 for x in d) / 3)
    assert m["mismatch/abs_delta_mean"] == pytest.approx(1 / 3)
    w = [math.exp(0.5), math.exp(-0.5), 1.0]
    mu = sum(w) / 3
    assert m["weights/mean"] == pytest.approx(mu, rel=1e-6)
    assert m["weights/ess"] == pytest.approx(1 / (sum((x / mu) ** 2 for x in w) / 3), rel=1e-6)
    assert m["weights/min"] == pytest.approx(math.exp(-0.5), rel=1e-6)
    assert m["turn/abs_delta_mean/1"] == pytest.approx(0.5)
    assert m["turn/abs_delta_mean/2"] == pytest.approx(0.0)
    assert m["turn/abs_prefix_logratio/2"] == pytest.approx(0.0)
    out = compute_correction("interq", p, b + torch.tensor([[0.0, -1.0, 0.0, 0.0]]), mask, config=CorrectionConfig(budget=0.1))
    # turn 1 deltas 0.5, 0.5 -> D = 1, s = 1, demand(turn 2) = 1 > 0.1 -> kappa = 0.1, Lambda = 0.1
    assert out.metrics["interq/budget_bound_frac"] == pytest.approx(0.5)
    assert out.metrics["turn/abs_Lambda/2"] == pytest.approx(0.1)
    assert out.metrics["turn/abs_prefix_logratio/2"] == pytest.approx(1.0)
    assert out.metrics["interq/support_mean"] == pytest.approx(1.0)
    assert out.metrics["interq/lambda_abs_mean"] == pytest.approx(0.05)


def test_icepop_and_geo_keep_masks_and_seq_is_cap():
    mask = torch.ones(2, 3, dtype=torch.bool)
    p = torch.zeros(2, 3)
    b = torch.tensor([[-1.0, 0.0, 0.8], [0.05, 0.0, 0.0]])  # rho row0: e, 1, e^-0.8
    out = compute_correction("icepop", p, b, mask)
    assert out.keep_mask.tolist() == [[False, True, False], [True, True, True]]
    out = compute_correction("geo_mask", p, b, mask)  # row0 mean delta = 0.2/3 -> exp 1.069 kept; row1 -0.05/3 kept
    assert out.keep_mask.all()
    out = compute_correction("geo_mask", p, b, mask, config=CorrectionConfig(geo_bounds=(0.98, 1.02)))
    assert out.keep_mask.tolist() == [[False] * 3, [True] * 3]
    out = compute_correction("seq_is", p, b, mask)
    assert out.weights[0].tolist() == pytest.approx([math.exp(0.2)] * 3, rel=1e-6)
    out = compute_correction("seq_is", p, b - 3, mask)
    assert out.weights.max().item() == pytest.approx(2.0)


# ---------------------------------------------------------------------------------------------------
# Bad input


def test_bad_inputs_raise_clear_errors():
    p = torch.zeros(2, 4)
    mask = torch.ones(2, 4, dtype=torch.bool)
    with pytest.raises(ValueError, match="unknown correction method='bogus'.*interq_uniform"):
        compute_correction("bogus", p, p, mask)
    with pytest.raises(ValueError, match="behavior_logprobs shape"):
        compute_correction("tis", p, torch.zeros(2, 5), mask)
    with pytest.raises(ValueError, match="action_mask shape"):
        compute_correction("tis", p, p, torch.ones(2, 3, dtype=torch.bool))
    with pytest.raises(TypeError, match="action_mask must have dtype torch.bool"):
        compute_correction("tis", p, p, mask.long())
    with pytest.raises(TypeError, match="proximal_logprobs must be a floating"):
        compute_correction("tis", p.long(), p, mask)
    with pytest.raises(ValueError, match=r"proximal_logprobs must have shape \[B, L\]"):
        compute_correction("tis", p[0], p[0], mask[0])
    with pytest.raises(ValueError, match="traj_id and turn_idx must be given together"):
        compute_correction("tis", p, p, mask, traj_id=torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="turn_idx must have shape"):
        compute_correction("tis", p, p, mask, traj_id=torch.tensor([0, 1]), turn_idx=torch.tensor([0, 1, 2]))
    with pytest.raises(TypeError, match="traj_id must have an integer dtype"):
        compute_correction("tis", p, p, mask, traj_id=torch.tensor([0.0, 1.0]), turn_idx=torch.tensor([0, 1]))
    with pytest.raises(TypeError, match="config must be a CorrectionConfig"):
        compute_correction("tis", p, p, mask, config={"budget": 1})
    with pytest.raises(ValueError, match="budget must be a number >= 0"):
        interq_prefix_logweights(p, p, mask, -1.0)


def test_config_validation():
    with pytest.raises(ValueError, match="budget must be >= 0"):
        CorrectionConfig(budget=-0.1)
    with pytest.raises(ValueError, match="tis_cap must be > 0"):
        CorrectionConfig(tis_cap=0.0)
    with pytest.raises(ValueError, match="icepop_bounds must satisfy"):
        CorrectionConfig(icepop_bounds=(2.0, 0.5))
    with pytest.raises(TypeError, match="geo_bounds must be a pair"):
        CorrectionConfig(geo_bounds=1.0)
    with pytest.raises(TypeError, match="normalize must be a bool"):
        CorrectionConfig(normalize=1)
    with pytest.raises(ValueError, match="budget must not be NaN"):
        CorrectionConfig(budget=math.nan)
    cfg = CorrectionConfig(icepop_bounds=[0.5, 2])
    assert cfg.icepop_bounds == (0.5, 2.0)
    assert CorrectionConfig(budget=math.inf).budget == math.inf
    with pytest.raises(Exception):
        cfg.budget = 1.0  # frozen
    assert CorrectionMethod("interq") is CorrectionMethod.INTERQ
    assert isinstance(compute_correction(CorrectionMethod.TIS, torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2, dtype=torch.bool)), Correction)


def test_dtypes_are_accepted_and_output_float32():
    p, b, mask = _random_concat(3)
    ref = compute_correction("interq", p.double(), b.double(), mask)
    for dt in (torch.float32, torch.bfloat16):
        out = compute_correction("interq", p.to(dt), b.to(dt), mask)
        assert out.weights.dtype == torch.float32
    out = compute_correction("interq", p, b, mask)
    _close(out.weights, ref.weights, 1e-5)


# ---------------------------------------------------------------------------------------------------
# Hypothesis: small arbitrary batches against the reference, in both layouts

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as hs  # noqa: E402


@hs.composite
def _small_batches(draw):
    B = draw(hs.integers(1, 4))
    L = draw(hs.integers(1, 10))
    mask = torch.tensor(draw(hs.lists(hs.lists(hs.booleans(), min_size=L, max_size=L), min_size=B, max_size=B)))
    vals = hs.one_of(hs.floats(-4.0, 4.0, allow_nan=False), hs.sampled_from([math.nan, math.inf, -math.inf, 25.0, -25.0]))
    d = torch.tensor(draw(hs.lists(hs.lists(vals, min_size=L, max_size=L), min_size=B, max_size=B)), dtype=torch.float32)
    p = -torch.rand(B, L, generator=torch.Generator().manual_seed(draw(hs.integers(0, 2**16))))
    return p, p - d, mask.reshape(B, L)


@settings(max_examples=40, deadline=None)
@given(batch=_small_batches(), method=hs.sampled_from(METHODS), budget=hs.sampled_from([0.0, 0.05, 0.5, 3.0, math.inf]))
def test_hypothesis_reference_and_layouts(batch, method, budget):
    p, b, mask = batch
    cfg = CorrectionConfig(budget=budget)
    out = compute_correction(method, p, b, mask, config=cfg)
    W, K, LAM = _ref(method, p, b, mask, cfg=cfg)
    assert torch.equal(out.keep_mask, torch.tensor(K).reshape(mask.shape))
    _close(out.weights, torch.tensor(W).reshape(mask.shape))
    if LAM is not None:
        _close(out.lambda_, torch.tensor(LAM).reshape(mask.shape))
        if method != "prefix_is":
            assert out.lambda_.abs().max().item() <= budget + 1e-6
    if mask.any():
        pp, bb, mm, tid, tix, src = _to_per_turn(p, b, mask, 0, dup=1, empty_rows=1)
        pt = compute_correction(method, pp, bb, mm, traj_id=tid, turn_idx=tix, config=cfg)
        w, k = _concat_view(pt, src, mask.shape)
        assert torch.equal(k, out.keep_mask)
        _close(w, out.weights, 1e-6)
