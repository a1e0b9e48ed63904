"""``torch.nn.functional.linear`` replaced process-wide for the duration of a ``with``: the one mechanism under the
learner's two linear-layer routes, :mod:`interq.train.onednn_gemm` (fp32 GEMMs through oneDNN) and
:mod:`interq.train.bf16_backward` (bf16 backward GEMMs, whose fp32 forward is the former's when both are open).

Process-wide, not a ``TorchFunctionMode``: modes are thread-local and the autograd engine does not carry them into
the backward, where activation checkpointing recomputes the forward. So it is not thread-safe: one learner per
process.
"""

from __future__ import annotations

import torch.nn.functional as F

F_LINEAR = F.linear  # torch's own, as imported before any swap


class LinearSwap:
    """``torch.nn.functional.linear`` replaced by ``fn`` while any ``with`` of this object is open (nesting counted),
    and what it was before put back when the outermost closes (torch's own, or another swap open around this one)."""

    def __init__(self, fn) -> None:
        self.fn, self.depth, self.outer = fn, 0, None

    def __enter__(self) -> None:
        if self.depth == 0:
            self.outer, F.linear = F.linear, self.fn
        self.depth += 1

    def __exit__(self, *exc) -> None:
        self.depth -= 1
        if self.depth == 0:
            F.linear, self.outer = self.outer, None
