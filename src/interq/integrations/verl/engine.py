"""Alignment on verl: an FSDP training engine whose actor forward is the aligned quantized forward.

verl's fp8 rollout (``actor_rollout_ref.rollout.quantization=fp8``) runs vLLM with blockwise e4m3
weights (128x128 blocks, scale amax/448), dynamic per-token-group (1x128) e4m3 activations, the MoE
router ``mlp.gate`` excluded, and an unquantized KV cache. The matching aligned forward
(docs/executor.md, "Alignment") is ``interq.quant.aligned(model, QuantConfig(w_format="fp8_e4m3",
w_granularity="block128", a_granularity="group128", kv_format="none"))``: the same quantize-dequantize
on every decoder linear, with a straight-through estimator so gradients reach the master weights.

The engine subclasses verl's ``FSDPEngineWithLMHead`` and wraps ``forward_step`` (used for both the
no-grad ``old_log_probs`` pass and the training forward) in that context manager. It is registered in
verl's ``EngineRegistry`` under the vendor ``interq`` for the ``fsdp`` and ``fsdp2`` backends on CUDA,
so it replaces the stock engine only where a worker runs with ``VERL_ENGINE_VENDOR=interq``.

``INTERQ_VERL_ALIGN`` picks the numerics: ``fp8_block128`` (default, verl's fp8 rollout), ``w8a8_int8``,
``w8a8_int8_kv_int8``, ``w8a8_int8_kv_fp8`` (interq's int8 W8A8 rollout, ``rollout.quantization=w8a8_int8``, with
vLLM's KV cache in the model dtype, ``int8_per_token_head`` or ``fp8``), ``none`` (stock forward; handy to A/B the
same run) or a JSON object of :class:`interq.quant.QuantConfig` fields.
"""

from __future__ import annotations

import json
import os
from typing import Any, Mapping

from interq.integrations.verl.correction import InterqVerlError

VENDOR = "interq"
ALIGN_ENV = "INTERQ_VERL_ALIGN"
BACKENDS = ("fsdp", "fsdp2")
DEVICES = ("cuda",)
PRESETS: dict[str, dict[str, Any] | None] = {
    # verl's FP8_BLOCK_QUANT_KWARGS: fmt e4m3, weight_block_size [128, 128], activation_scheme dynamic
    "fp8_block128": {"w_format": "fp8_e4m3", "w_granularity": "block128", "a_granularity": "group128", "kv_format": "none"},
    # the w8a8_int8 rollout (interq.integrations.verl.w8a8): int8 per-channel weights, dynamic per-token int8
    # activations; KV: none (vLLM kv_cache_dtype=auto), int8 per token and head (int8_per_token_head), fp8 (fp8)
    "w8a8_int8": {"w_format": "int8", "w_granularity": "channel", "w_int8_range": "sym127", "a_granularity": "token",
                  "a_int8_rounding": "half_even", "kv_format": "none"},
    "w8a8_int8_kv_int8": {"w_format": "int8", "w_granularity": "channel", "w_int8_range": "sym127",
                          "a_granularity": "token", "a_int8_rounding": "half_even",
                          "kv_format": "int8_per_token_head", "kv_int8_store": "trunc"},
    "w8a8_int8_kv_fp8": {"w_format": "int8", "w_granularity": "channel", "w_int8_range": "sym127",
                         "a_granularity": "token", "a_int8_rounding": "half_even", "kv_format": "fp8_tensor",
                         "kv_tensor_scale": 1.0},
    "none": None,
}
W8A8_PRESETS = {"none": "w8a8_int8", "int8": "w8a8_int8_kv_int8", "fp8": "w8a8_int8_kv_fp8"}
"""KV choice of the w8a8_int8 rollout -> the aligned preset of the same numerics."""
ENGINE_NAME = "InterqAlignedFSDPEngineWithLMHead"


def align_qcfg(spec: str | None = None, environ: Mapping[str, str] | None = None):
    """The :class:`QuantConfig` of the aligned forward, or None for the stock forward.

    ``spec`` (default: ``$INTERQ_VERL_ALIGN``, else ``fp8_block128``) is a preset name or a JSON object.
    """
    from interq.quant import QuantConfig

    if spec is None:
        spec = (environ if environ is not None else os.environ).get(ALIGN_ENV, "fp8_block128")
    spec = spec.strip()
    if spec in PRESETS:
        fields = PRESETS[spec]
        return None if fields is None else QuantConfig(**fields)
    if spec.startswith("{"):
        try:
            d = json.loads(spec)
        except json.JSONDecodeError as e:
            raise InterqVerlError(f"{ALIGN_ENV} is not valid JSON ({e}): {spec!r}") from e
        try:
            return QuantConfig.from_dict(d)
        except (TypeError, ValueError) as e:
            raise InterqVerlError(f"{ALIGN_ENV}: {e}") from e
    raise InterqVerlError(
        f"{ALIGN_ENV}={spec!r} is not accepted; accepted: {', '.join(PRESETS)} or a JSON object of QuantConfig fields"
    )


class AlignedForwardMixin:
    """Runs the base engine's ``forward_step`` inside ``interq.quant.aligned(self.module, qcfg)``."""

    interq_qcfg = None

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.interq_qcfg = align_qcfg()

    def forward_step(self, micro_batch, loss_function, forward_only):
        if self.interq_qcfg is None:
            return super().forward_step(micro_batch, loss_function, forward_only)
        from interq.quant import aligned

        with aligned(self.module, self.interq_qcfg):
            return super().forward_step(micro_batch, loss_function, forward_only)


def engine_class():
    """The aligned engine class (subclass of verl's ``FSDPEngineWithLMHead``); imports verl's FSDP engine."""
    global _ENGINE_CLS
    if _ENGINE_CLS is None:
        from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

        _ENGINE_CLS = type(
            ENGINE_NAME,
            (AlignedForwardMixin, FSDPEngineWithLMHead),
            {"__doc__": "verl's FSDP LM engine with interq's aligned quantized forward (see interq.integrations.verl.engine).",
             "__module__": __name__},
        )
    return _ENGINE_CLS


_ENGINE_CLS = None


def register_engine() -> type:
    """Register the aligned engine under vendor ``interq`` (idempotent); returns the class."""
    from verl.workers.engine.base import EngineRegistry

    cls = engine_class()
    registry = EngineRegistry._engines.get("language_model", {})
    todo = [b for b in BACKENDS if any((d, VENDOR) not in registry.get(b, {}) for d in DEVICES)]
    if todo:
        EngineRegistry.register(model_type="language_model", backend=todo, device=list(DEVICES), vendor=VENDOR)(cls)
    return cls
