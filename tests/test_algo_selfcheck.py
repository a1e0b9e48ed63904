"""``interq selfcheck`` runs, checks the §3 properties on its synthetic batch and ends with RESULT."""

from __future__ import annotations

import json

from interq.selfcheck import main


def test_selfcheck_passes_and_ends_with_result(capsys):
    assert main(["--trajectories", "12", "--turns", "5", "--budget", "0.3"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-1].startswith("RESULT ")
    res = json.loads(out[-1][len("RESULT ") :])
    assert res["ok"] and res["checks_passed"] == res["checks_total"] >= 10
    assert res["abs_Lambda_last_turn"] <= 0.3 + 1e-9
    assert any(line.startswith("interq ") for line in out)  # the method table
