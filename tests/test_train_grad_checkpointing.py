"""train.gradient_checkpointing: the learner recomputes each decoder layer's activations in the backward.

The gradient equals the one without checkpointing (same ops recomputed), for the plain learner and for the aligned
(quantized-like) learner of q-align / q-interq, because the training step runs its backward inside the learner's
forward context (``interq.train.rl.learner_context``). Shown beside it: a backward outside the aligned context
would recompute the plain forward; torch's non-reentrant checkpoint notices and raises (nothing silently wrong).
"""

from __future__ import annotations

import pytest
import torch

from interq.quant import QuantConfig
from interq.quant.testing import tiny_causal_lm
from interq.train.rl import _sequence_logprobs, enable_activation_checkpointing, learner_context
from test_train_learner_autocast import _micro_batch


def _grad(model, align, checkpointing, backward_inside=True):
    qcfg = QuantConfig() if align else None
    enable_activation_checkpointing(model, checkpointing)
    model.train()
    model.zero_grad(set_to_none=True)
    mb, batch = _micro_batch()
    adv = torch.linspace(-1, 1, mb["input_ids"].shape[0])[:, None]  # [B, 1]
    with learner_context(model, align, qcfg):
        lp = _sequence_logprobs(model, mb, batch)  # [B, L]
        loss = -(lp * adv)[mb["action_mask"]].sum()
        if backward_inside:
            loss.backward()
    if not backward_inside:
        loss.backward()
    return torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None])  # [P]


@pytest.mark.parametrize("align", [False, True], ids=["plain", "aligned"])
def test_checkpointed_gradient_equals_the_kept_activations_gradient(align):
    model = tiny_causal_lm("qwen3", num_layers=3)
    kept = _grad(model, align, checkpointing=False)
    recomputed = _grad(model, align, checkpointing=True)
    assert kept.abs().max() > 0
    torch.testing.assert_close(recomputed, kept, rtol=1e-5, atol=1e-7)


def test_a_backward_outside_the_aligned_context_is_refused_not_computed_wrong():
    model = tiny_causal_lm("qwen3", num_layers=3)
    with pytest.raises(torch.utils.checkpoint.CheckpointError, match="different number of tensors"):
        _grad(model, True, checkpointing=True, backward_inside=False)


def test_the_field_is_validated_naming_it():
    from interq.train.config import ConfigError, build_config

    assert build_config("q-interq", []).train.gradient_checkpointing is False
    assert build_config("q-interq", ["train.gradient_checkpointing=true"]).train.gradient_checkpointing is True
    with pytest.raises(ConfigError, match=r"train\.gradient_checkpointing"):
        build_config("q-interq", ["train.gradient_checkpointing=sometimes"])
