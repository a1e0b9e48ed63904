"""interq.algo.metrics (docs/algorithm.md, "Logged metrics") and the import boundary of interq.algo."""

from __future__ import annotations

import pytest
import torch

from interq.algo.corrections import CorrectionConfig, compute_correction
from interq.algo.metrics import TURN_CURVES, interq_metrics, turn_curve, turn_curve_metrics, turn_key, weight_metrics


def test_turn_key_format_and_round_trip():
    assert turn_key("abs_Lambda", 3) == "turn/abs_Lambda/3"
    m = turn_curve_metrics(torch.tensor([1, 2, 2, 1, 3]), {"abs_Lambda": (torch.tensor([0.0, 1.0, 3.0, 0.0, 5.0]), torch.ones(5))})
    assert m == {"turn/abs_Lambda/1": 0.0, "turn/abs_Lambda/2": 2.0, "turn/abs_Lambda/3": 5.0}
    assert turn_curve({**m, "turn/abs_Lambda/10": 9.0, "weights/ess": 1.0}, "abs_Lambda") == [0.0, 2.0, 5.0, 9.0]
    with pytest.raises(ValueError, match="curve='lambda' is not a turn curve; accepted: " + ", ".join(TURN_CURVES)):
        turn_key("lambda", 1)
    with pytest.raises(ValueError, match="t=0 must be >= 1"):
        turn_key("abs_Lambda", 0)


def test_ess_closed_forms():
    keep = torch.ones(1, 4, dtype=torch.bool)
    assert weight_metrics(torch.full((1, 4), 3.0), keep, keep)["weights/ess"] == pytest.approx(1.0)
    m = weight_metrics(torch.tensor([[5.0, 0.0, 0.0, 0.0]]), keep, keep)
    assert m["weights/ess"] == pytest.approx(0.25)
    assert m["weights/std"] == pytest.approx(torch.tensor([5.0, 0, 0, 0]).std(unbiased=False).item())
    half = torch.tensor([[True, True, False, False]])
    m = weight_metrics(torch.tensor([[1.0, 3.0, 100.0, 100.0]]), half, keep)
    assert m["weights/max"] == 3.0 and m["weights/keep_frac"] == 0.5 and m["weights/mean"] == 2.0


def test_interq_metrics_by_hand():
    m = interq_metrics(torch.tensor([1.0, 0.5, 0.25, 1.0]), torch.tensor([1.0, 0.5, 0.2, 0.9]), torch.tensor([0.0, -0.5, 0.5, 0.1]), torch.tensor([True, True, True, False]))
    assert m["interq/budget_bound_frac"] == 0.5
    assert m["interq/lambda_abs_mean"] == pytest.approx(1.1 / 4)
    assert m["interq/support_mean"] == pytest.approx(1.7 / 3)
    assert m["interq/kappa_mean"] == pytest.approx(2.75 / 4)


def test_normalize_gives_unit_mean_over_kept_tokens():
    g = torch.Generator().manual_seed(0)
    p = -torch.rand(4, 20, generator=g)
    b = p + torch.randn(4, 20, generator=g) * 0.3
    mask = torch.rand(4, 20, generator=g) < 0.5
    for method in ("tis", "icepop", "interq", "prefix_is"):
        c = compute_correction(method, p, b, mask, config=CorrectionConfig(normalize=True))
        assert c.weights[c.keep_mask].mean().item() == pytest.approx(1.0, abs=1e-6)
        assert c.metrics["weights/mean"] == pytest.approx(1.0, abs=1e-6)


def test_metric_names_are_the_spec_names():
    p = torch.zeros(2, 6)
    b = p - 0.1
    mask = torch.tensor([[True, True, False, True, True, False], [False, True, True, False, True, True]])
    m = compute_correction("interq", p, b, mask).metrics
    for k in (
        "mismatch/k1", "mismatch/k3", "mismatch/chi2_token", "mismatch/abs_delta_mean", "mismatch/nonfinite_frac",
        "weights/mean", "weights/std", "weights/min", "weights/max", "weights/ess", "weights/keep_frac",
        "interq/budget_bound_frac", "interq/lambda_abs_mean", "interq/support_mean",
        "turn/abs_delta_mean/1", "turn/abs_prefix_logratio/2", "turn/abs_Lambda/2",
    ):
        assert k in m, k
    assert all(isinstance(v, float) for v in m.values())
    assert "turn/abs_Lambda/1" not in compute_correction("tis", p, b, mask).metrics


def test_per_turn_row_with_gaps_is_one_segment():
    p = torch.zeros(1, 6)
    b = torch.tensor([[-0.1, 9.0, -0.2, -0.3, 9.0, 9.0]])
    gap = torch.tensor([[True, False, True, True, False, False]])
    # turn 0 has a gap inside its row; turn 1 is a second row
    P = torch.cat([p, p])
    Bh = torch.cat([b, torch.full((1, 6), -0.05)])
    Mk = torch.cat([gap, torch.tensor([[True, True, False, False, False, False]])])
    lam = compute_correction("interq", P, Bh, Mk, traj_id=torch.tensor([5, 5]), turn_idx=torch.tensor([0, 1]), config=CorrectionConfig(budget=float("inf"))).lambda_
    d = torch.tensor([0.1, 0.2, 0.3])
    r = torch.exp(d - d.max())
    s = (r.sum() ** 2 / (3 * (r * r).sum())).item()
    assert lam[1, 0].item() == pytest.approx(s * 0.6, rel=1e-5)


def test_algo_imports_nothing_else_from_interq():
    """Static check of every import statement in src/interq/algo (imports flow one way)."""
    import ast
    from pathlib import Path

    import interq.algo

    bad = []
    for f in Path(interq.algo.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            bad += [f"{f.name}: {n}" for n in names if n.startswith("interq") and not n.startswith("interq.algo")]
    assert not bad, bad
