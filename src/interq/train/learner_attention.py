"""The learner's attention for the duration of a pass (``train.learner_attention``): ``sdpa`` (transformers' own)
or ``kernel``, interq's causal fp32 CPU kernel (:mod:`interq.kernels.causal_attention`: the attention function, its
gradient and which calls it takes; to rounding, not torch's bits).

Inside :func:`interq.train.rl.learner_context` with ``attention='kernel'`` the model's attention implementation is
:data:`NAME` (restored on exit, so the executor, a copy of the learner, never inherits it).
"""

from __future__ import annotations

import contextlib

import torch

from interq.kernels.causal_attention import NAME, causal_attention, kernel_attention, register, require_kernels

__all__ = ["LEARNER_ATTENTIONS", "NAME", "causal_attention", "kernel_attention", "learner_attention"]

LEARNER_ATTENTIONS = ("sdpa", "kernel")  # = interq.train.config.LEARNER_ATTENTIONS (tested)


@contextlib.contextmanager
def learner_attention(model: torch.nn.Module, attention: str = "sdpa"):
    """The learner's attention for the duration (``train.learner_attention``): ``sdpa`` leaves the model as it is;
    ``kernel`` sets :data:`NAME` on a model with transformers' sdpa attention and restores it on exit."""
    if attention not in LEARNER_ATTENTIONS:
        raise ValueError(f"train.learner_attention={attention!r} is not accepted; choose one of {list(LEARNER_ATTENTIONS)}")
    config = getattr(model, "config", None)
    current = getattr(config, "_attn_implementation", None)
    if attention == "sdpa" or current == NAME:  # sdpa, or already inside (a nested context)
        yield
        return
    if current != "sdpa":
        raise ValueError(f"train.learner_attention='kernel' needs a model with transformers' sdpa attention; "
                         f"{type(model).__name__} uses {current!r}")
    require_kernels()  # built once per machine; an error naming the field where it cannot be
    register()
    config._attn_implementation = NAME  # as interq.quant.aligned does (which then wraps this one)
    try:
        yield
    finally:
        config._attn_implementation = current
