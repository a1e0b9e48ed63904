"""The InterQ-RL math as pure tensor functions (docs/algorithm.md).  Imports nothing else from interq.

- ``interq.algo.corrections``  per-token weights and keep-masks: none, tis, icepop, seq_is, geo_mask,
  prefix_is, interq, interq_uniform (§2-§5)
- ``interq.algo.metrics``      the §7 metrics and the per-turn accumulation curves
- ``interq.algo.advantages``   GRPO and GiGPO (§6), and the broadcast to tokens
- ``interq.algo.loss``         the decoupled PPO loss with weights and keep-mask (§6)
"""

from interq.algo.advantages import broadcast_to_tokens, gigpo_advantages, grpo_advantages
from interq.algo.corrections import (
    METHODS,
    Correction,
    CorrectionConfig,
    CorrectionMethod,
    compute_correction,
    interq_prefix_logweights,
)
from interq.algo.loss import AGGREGATIONS, LossAggregation, ppo_loss

__all__ = [
    "AGGREGATIONS",
    "LossAggregation",
    "ppo_loss",
    "broadcast_to_tokens",
    "gigpo_advantages",
    "grpo_advantages",
    "METHODS",
    "Correction",
    "CorrectionConfig",
    "CorrectionMethod",
    "compute_correction",
    "interq_prefix_logweights",
]
