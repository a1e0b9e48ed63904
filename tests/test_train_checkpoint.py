"""Atomic checkpoints: weights, optimizer, RNG, step; a half-written checkpoint is never picked up."""

import random

import torch

from interq.train.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from interq.train.config import ModelConfig, RunConfig
from interq.train.policy import build_tiny_policy

TEXTS = ["go to countertop 1", "take apple 1 from countertop 1", "put apple 1 in/on fridge 1"] * 10


def _policy():
    return build_tiny_policy(ModelConfig(vocab_size=300, hidden_size=16, intermediate_size=32, num_heads=2,
                                         num_kv_heads=1, head_dim=8), TEXTS)


def test_checkpoint_round_trip_and_latest(tmp_path):
    model, tok = _policy()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.tensor([[1, 2, 3]])).logits.sum().backward()
    opt.step()
    torch.manual_seed(123)
    random.seed(5)
    save_checkpoint(tmp_path, 3, model, tok, opt, RunConfig(), {"extra": 1})
    expected_draw = (torch.rand(3), random.random())
    # a crash mid-write leaves a temporary folder: never taken for a checkpoint
    (tmp_path / "checkpoints" / ".tmp_step_000004_x").mkdir()
    ck = latest_checkpoint(tmp_path)
    assert ck.name == "step_000003"

    model2, _ = _policy()
    with torch.no_grad():
        for p in model2.parameters():
            p.add_(1.0)
    opt2 = torch.optim.AdamW(model2.parameters(), lr=1e-2)
    state = load_checkpoint(ck, model2, opt2)
    assert state == {"step": 3, "extra": 1}
    for p, q in zip(model.parameters(), model2.parameters()):
        assert torch.equal(p, q)
    assert opt2.state_dict()["state"][0]["step"] == opt.state_dict()["state"][0]["step"]
    assert torch.equal(torch.rand(3), expected_draw[0]) and random.random() == expected_draw[1]


def test_keeps_only_recent_checkpoints(tmp_path):
    model, tok = _policy()
    for step in (1, 2, 3):
        save_checkpoint(tmp_path, step, model, tok, None, RunConfig(), keep=2)
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("step_*")) == ["step_000002", "step_000003"]
    assert latest_checkpoint(tmp_path).name == "step_000003"
