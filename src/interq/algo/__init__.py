"""The InterQ-RL math as pure tensor functions (interq-spec.md).  Imports nothing else from interq.

- ``interq.algo.corrections``  per-token weights and keep-masks: none, tis, icepop, seq_is, geo_mask,
  prefix_is, interq, interq_uniform (§2-§5)
- ``interq.algo.metrics``      the §7 metrics and the per-turn accumulation curves
"""

from interq.algo.corrections import (
    METHODS,
    Correction,
    CorrectionConfig,
    CorrectionMethod,
    compute_correction,
    interq_prefix_logweights,
)

__all__ = [
    "METHODS",
    "Correction",
    "CorrectionConfig",
    "CorrectionMethod",
    "compute_correction",
    "interq_prefix_logweights",
]
