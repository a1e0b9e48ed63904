"""benchmarks/bench_vllm.py: the greedy-agreement bookkeeping (no vLLM, no checkpoint needed)."""

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import torch

_spec = importlib.util.spec_from_file_location("bench_vllm", Path(__file__).resolve().parents[1] / "benchmarks" / "bench_vllm.py")
bench_vllm = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_vllm)


class _LastTokenModel:
    """Logits depend on the last token only: after token t, token (t + 1) % V scores 1.0 and token (t + 2) % V 0.9."""

    def __init__(self, vocab: int = 8):
        self.vocab = vocab

    def __call__(self, ids):
        logits = torch.zeros(ids.shape[0], ids.shape[1], self.vocab)
        for j in range(ids.shape[1]):
            t = int(ids[0, j])
            logits[0, j, (t + 1) % self.vocab] = 1.0
            logits[0, j, (t + 2) % self.vocab] = 0.9
        return SimpleNamespace(logits=logits)


def test_agreement_counts_up_to_the_first_divergence():
    assert bench_vllm.agreement([[1, 2, 3, 4]], [[1, 2, 3, 4]], k=4) == 1.0
    assert bench_vllm.agreement([[1, 9, 3, 4]], [[1, 2, 3, 4]], k=4) == 0.5  # 1 same, then the break counts once
    assert bench_vllm.agreement(None, [[1]]) is None


def test_divergence_margins_reports_the_fp32_logits_of_both_choices():
    model = _LastTokenModel()
    prompts = [[0], [3]]
    ref = [[1, 2, 3], [4, 5, 6]]
    other = [[1, 3, 4], [4, 5, 6]]  # row 0 leaves ref at step 1 (after token 1: ref's 2 scores 1.0, other's 3 0.9)
    rows = bench_vllm.divergence_margins(model, prompts, other, ref, k=3)
    assert len(rows) == 1
    d = rows[0]
    assert (d["row"], d["step"], d["ref"], d["other"]) == (0, 1, 2, 3)
    assert abs(d["margin"] - 0.1) < 1e-6 and abs(d["top2_gap"] - 0.1) < 1e-6
    assert bench_vllm.divergence_margins(model, prompts, None, ref) == []
