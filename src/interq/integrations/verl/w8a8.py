"""The int8 W8A8 rollout's numerics and its bf16 -> compressed-tensors conversion (no vLLM, no verl import).

``actor_rollout_ref.rollout.quantization=w8a8_int8`` (added by the plugin, :mod:`interq.integrations.verl.vllm_w8a8`)
serves the policy in vLLM as a compressed-tensors W8A8 int8 model and re-quantizes it at every weight sync with
:func:`quantize_weights`. The numerics are interq's executor's (``interq.quant``, :func:`aligned_qcfg`):

- weights: int8, symmetric, one scale per output channel, ``s = amax / 127``, ``q = clamp(round_half_even(w / s),
  -127, 127)`` (:func:`interq.quant.primitives.quant_weight_int8`, ``sym127``); an all-zero row gets ``s = 1``;
- activations: dynamic per-token symmetric int8, ``s = amax / 127`` (vLLM's ``dynamic_scaled_int8_quant``; the
  CUDA kernel rounds half to even, ``a_int8_rounding='half_even'``);
- the decoder's linears only (``q|k|v|o_proj``, ``gate|up|down_proj``, and any other ``nn.Linear`` under
  ``model.layers``), the MoE router ``mlp.gate`` and ``shared_expert_gate`` excluded; embeddings, ``lm_head`` and
  norms stay in the model dtype.

Checkpoint layout (compressed-tensors ``int-quantized``, what vLLM's ``CompressedTensorsW8A8Int8`` scheme loads):
every quantized ``<module>.weight`` becomes an int8 ``[N, K]`` tensor plus ``<module>.weight_scale`` fp32 ``[N, 1]``.
Fused layers are not fused here: ``q_proj``, ``k_proj``, ``v_proj`` (and ``gate_proj``, ``up_proj``) keep their own
names and scales, and vLLM's loader stacks them into ``qkv_proj`` / ``gate_up_proj`` (its ``weight`` ``[N_q+N_k+N_v,
K]`` then transposed to ``[K, N]``, its ``weight_scale`` the concatenated ``[N, 1]``). Per-channel scales make that
stacking exact: the fused layer's codes and scales equal the members' concatenated, which is what interq's executor
holds in its ``FusedQuantLinear`` (tested against it).

KV cache: :data:`KV_CACHE_DTYPES` maps ``kv`` to vLLM's own ``kv_cache_dtype``: ``int8`` -> ``int8_per_token_head``
(dynamic scales per token and head, written with each token: nothing to calibrate or refresh at a weight sync; the
Triton store truncates toward zero, ``kv_int8_store='trunc'``), ``fp8`` -> ``fp8`` (one scale per layer, 1.0 when
uncalibrated, ``kv_format='fp8_tensor'``), ``none`` -> ``auto`` (the model dtype). :func:`aligned_qcfg` is the
learner-side ``QuantConfig`` of each choice (the aligned engine's ``INTERQ_VERL_ALIGN`` presets).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from interq.integrations.verl.correction import InterqVerlError

QUANTIZATION = "w8a8_int8"
"""The value of ``actor_rollout_ref.rollout.quantization`` that selects this rollout."""

KV_CACHE_DTYPES: dict[str, str] = {"none": "auto", "int8": "int8_per_token_head", "fp8": "fp8"}
"""``kv`` -> vLLM's ``kv_cache_dtype``."""

_W8A8 = {"w_format": "int8", "w_granularity": "channel", "w_int8_range": "sym127", "a_granularity": "token",
         "a_int8_rounding": "half_even"}
_KV = {"none": {"kv_format": "none"},
       "int8": {"kv_format": "int8_per_token_head", "kv_int8_store": "trunc"},
       "fp8": {"kv_format": "fp8_tensor", "kv_tensor_scale": 1.0}}

EXCLUDE: tuple[str, ...] = ("mlp.gate", "shared_expert_gate")
_DECODER_LINEAR = re.compile(r"(^|\.)layers\.\d+\.(.+)\.weight$")


def aligned_qcfg(kv: str = "none"):
    """interq's ``QuantConfig`` of the rollout with KV cache ``kv`` (one of :data:`KV_CACHE_DTYPES`)."""
    from interq.quant import QuantConfig

    if kv not in _KV:
        raise InterqVerlError(f"kv={kv!r} is not accepted for the w8a8_int8 rollout; accepted: {', '.join(_KV)}")
    return QuantConfig(**_W8A8, **_KV[kv])


def check_qcfg(qcfg) -> None:
    """Raise unless ``qcfg`` has the weight/activation numerics vLLM's compressed-tensors W8A8 int8 scheme runs."""
    bad = {k: getattr(qcfg, k) for k, v in _W8A8.items() if getattr(qcfg, k) != v}
    if qcfg.w_bits != 8 or qcfg.a_bits != 8:
        bad.update(w_bits=qcfg.w_bits, a_bits=qcfg.a_bits)
    if bad:
        raise InterqVerlError(f"the w8a8_int8 rollout runs {_W8A8} with 8-bit codes; this QuantConfig has {bad}")


def is_quantized_weight(name: str, exclude: tuple[str, ...] = EXCLUDE) -> bool:
    """Whether the checkpoint tensor ``name`` is a decoder linear's weight that the rollout quantizes."""
    if _DECODER_LINEAR.search(name) is None:
        return False
    module = name[: -len(".weight")]
    if any(module == s or module.endswith("." + s) for s in exclude):
        return False
    leaf = module.rpartition(".")[2]
    return not (leaf.endswith("norm") or "embed" in leaf or leaf in ("rotary_emb",))


def quantize_weights(weights: Iterable[tuple[str, torch.Tensor]], *, exclude: tuple[str, ...] = EXCLUDE,
                     linear_names: set[str] | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """bf16 (or fp32) ``(name, tensor)`` pairs -> the compressed-tensors W8A8 int8 pairs (module docstring).

    ``linear_names``: the qualified names of the model's ``nn.Linear`` weights; when given, only those are
    quantized (a 2-D tensor that is not a linear's weight, e.g. a MoE router kept in high precision, passes
    through). A generator: one tensor converted at a time, as verl streams its weight buckets.
    """
    from interq.quant.primitives import quant_weight_int8

    for name, w in weights:
        quantize = is_quantized_weight(name, exclude) and w.ndim == 2
        if linear_names is not None:
            quantize = quantize and name in linear_names
        if not quantize:
            yield name, w
            continue
        q, s = quant_weight_int8(w, "channel", "sym127")  # [N, K] int8, [N, 1] fp32
        yield name, q.contiguous()
        yield name[: -len("weight")] + "weight_scale", s.to(torch.float32).contiguous()


def compressed_tensors_config(exclude_modules: Iterable[str] = ()) -> dict[str, Any]:
    """The ``quantization_config`` of the W8A8 int8 model (``hf_overrides`` for vLLM, or a checkpoint's config).

    ``exclude_modules``: qualified module names kept in high precision besides ``lm_head`` (the routers)."""
    return {
        "quant_method": "compressed-tensors",
        "format": "int-quantized",
        "quantization_status": "compressed",
        "config_groups": {"group_0": {
            "targets": ["Linear"],
            "weights": {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel", "dynamic": False},
            "input_activations": {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token",
                                  "dynamic": True},
        }},
        "ignore": ["lm_head", *exclude_modules],
    }


def excluded_modules(num_layers: int, module_names: Iterable[str] = ()) -> list[str]:
    """Modules to keep in high precision: every name in ``module_names`` that ends in an :data:`EXCLUDE` suffix,
    plus ``model.layers.<i>.mlp.gate`` for each layer (verl's fp8 rollout ignores the same routers)."""
    names = {f"model.layers.{i}.mlp.gate" for i in range(num_layers)}
    names.update(n for n in module_names if any(n == s or n.endswith("." + s) for s in EXCLUDE))
    return sorted(names)


def kv_of_cache_dtype(cache_dtype: str | None) -> str:
    """vLLM's ``kv_cache_dtype`` (``engine_kwargs.vllm.kv_cache_dtype``) -> ``kv`` (inverse of :data:`KV_CACHE_DTYPES`)."""
    cache_dtype = cache_dtype or "auto"
    for kv, name in KV_CACHE_DTYPES.items():
        if cache_dtype == name or (kv == "fp8" and cache_dtype == "fp8_e4m3"):
            return kv
    raise InterqVerlError(
        f"actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_dtype={cache_dtype!r} is not supported with "
        f"rollout.quantization={QUANTIZATION}; accepted: {', '.join(sorted(set(KV_CACHE_DTYPES.values()) | {'fp8_e4m3'}))}")


def _get(cfg: Any, key: str, default: Any = None) -> Any:
    if cfg is None:
        return default
    try:
        return cfg.get(key, default) if hasattr(cfg, "get") else getattr(cfg, key, default)
    except Exception:  # noqa: BLE001 - omegaconf struct mode on a missing key
        return default


def check_rollout_config(config: Any, environ: dict | None = None) -> str | None:
    """Fail fast (before Ray starts) on a ``rollout.quantization=w8a8_int8`` run it cannot serve; returns its KV
    choice (``none`` | ``int8`` | ``fp8``) or None for another quantization. With ``VERL_ENGINE_VENDOR=interq`` the
    aligned engine's ``INTERQ_VERL_ALIGN`` must be the preset of the same numerics."""
    import os

    rollout = _get(_get(config, "actor_rollout_ref"), "rollout")
    if _get(rollout, "quantization") != QUANTIZATION:
        return None
    prefix = "actor_rollout_ref.rollout"
    if _get(rollout, "name", "vllm") != "vllm":
        raise InterqVerlError(f"{prefix}.quantization={QUANTIZATION} runs on vLLM; got {prefix}.name="
                              f"{_get(rollout, 'name')!r}")
    if _get(rollout, "load_format", "dummy") != "dummy":
        raise InterqVerlError(f"{prefix}.quantization={QUANTIZATION} needs {prefix}.load_format=dummy (vLLM gets the "
                              f"trainer's weights, quantized, at every sync), got {_get(rollout, 'load_format')!r}")
    kv = kv_of_cache_dtype(_get(_get(_get(rollout, "engine_kwargs"), "vllm"), "kv_cache_dtype"))
    env = os.environ if environ is None else environ
    if env.get("VERL_ENGINE_VENDOR") == "interq":
        from interq.integrations.verl.engine import ALIGN_ENV, W8A8_PRESETS, align_qcfg

        spec = env.get(ALIGN_ENV, "fp8_block128")
        if align_qcfg(spec) != aligned_qcfg(kv):
            raise InterqVerlError(
                f"{ALIGN_ENV}={spec!r} does not run the rollout's numerics ({prefix}.quantization={QUANTIZATION}, "
                f"kv_cache_dtype={KV_CACHE_DTYPES[kv]!r}); set {ALIGN_ENV}={W8A8_PRESETS[kv]}")
    return kv
