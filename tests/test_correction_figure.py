"""scripts/correction_figure.py draws docs/correction.png through the library's own functions: it runs, writes a PNG,
and the curve it plots stays within the budget while the raw prefix outgrows it."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "correction_figure.py"


def _load():
    spec = importlib.util.spec_from_file_location("correction_figure", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_figure_script_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "fig.png"
    assert _load().main(["--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_synthetic_episode_shows_the_budget_binding():
    from interq.algo.corrections import interq_prefix_logweights

    mod = _load()
    prox, beh, mask = mod.synthetic_episode()
    lam = mod.per_turn(interq_prefix_logweights(prox, beh, mask, 0.5), mask)
    unbounded = mod.per_turn(interq_prefix_logweights(prox, beh, mask, math.inf), mask)
    assert len(lam) == 12 and lam[0] == 0.0
    assert max(abs(x) for x in lam) <= 0.5 + 1e-6
    assert max(unbounded) > 1.0  # without a budget the history weight outgrows B = 0.5 late in the episode
