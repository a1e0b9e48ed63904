"""The ``verl.plugins`` entry point of ``interq[verl]``: importing this module installs the plugin.

verl >= 0.9 imports every entry point of the ``verl.plugins`` group on ``import verl`` (in every
process) and swallows load errors at DEBUG level, so this module does nothing expensive at import and
reports its own problems (a WARNING at load, a clear error when InterQ is selected but cannot run).

What :func:`install` hooks (each applied when verl imports the module, see ``_hooks``):

- ``verl.trainer.ppo.rollout_corr_helper.compute_rollout_correction_and_add_to_batch``: when
  ``algorithm.rollout_correction.rollout_is`` is ``interq``, ``interq_uniform`` or ``prefix_is`` the call
  goes to :func:`interq.integrations.verl.correction.compute_interq_correction_and_add_to_batch`; any other
  value goes to verl's own function, untouched.
- ``...rollout_corr_helper.apply_bypass_mode``: refuses an interq method (InterQ needs decoupled mode).
- ``verl.utils.config.validate_config`` (called by ``verl.trainer.main_ppo`` before Ray starts): checks an
  interq run's config (options, bypass mode, ``calculate_log_probs``, verl version) and fails fast.
- ``verl.trainer.ppo.ray_trainer.compute_advantage`` and
  ``verl.trainer.ppo.v1.utils.compute_advantage_for_multi_trajectories``: verl skips the correction
  silently when ``rollout_log_probs`` is missing; these raise instead when an interq method is selected
  and the batch reaches the advantage step without ``rollout_is_weights``.
- ``verl.workers.engine.fsdp.transformer_impl``: registers the aligned-forward engine under the vendor
  ``interq`` (selected with ``VERL_ENGINE_VENDOR=interq``, see :mod:`interq.integrations.verl.engine`).
- ``verl.experimental.agent_loop.agent_loop``: registers the ``interq_env`` agent loop (interq's environments,
  :mod:`interq.integrations.verl.agent_loop`).
- ``verl.workers.rollout.vllm_rollout.vllm_async_server`` and ``...vllm_rollout.utils``: add
  ``rollout.quantization=w8a8_int8`` (the int8 W8A8 rollout and its weight sync,
  :mod:`interq.integrations.verl.vllm_w8a8`).

``install()`` is idempotent: loading the plugin twice patches nothing twice and logs once.
"""

from __future__ import annotations

import functools
import logging
import os
from types import ModuleType
from typing import Any

from interq.integrations.verl import _hooks
from interq.integrations.verl.correction import (
    CONFIG_PATH,
    INTERQ_METHODS,
    InterqVerlError,
    check_method,
    compute_interq_correction_and_add_to_batch,
)

logger = logging.getLogger("interq.integrations.verl")
try:  # verl sets the root logger to WARNING; the one-line load message is INFO
    logger.setLevel(os.environ.get("INTERQ_VERL_LOG_LEVEL", "INFO").upper())
except ValueError:
    logger.setLevel(logging.INFO)

SUPPORTED_VERL = ">=0.9.1,<0.10"
HELPER_MODULE = "verl.trainer.ppo.rollout_corr_helper"
HELPER_FN = "compute_rollout_correction_and_add_to_batch"
BYPASS_FN = "apply_bypass_mode"
# modules that bind the helper function by name at import time: rebound if imported before the patch
_BINDERS = ("verl.trainer.ppo.v1.trainer_base",)

_MARK = "__interq_original__"
AGENT_LOOP_MODULE = "verl.experimental.agent_loop.agent_loop"
VLLM_SERVER_MODULE = "verl.workers.rollout.vllm_rollout.vllm_async_server"
VLLM_WORKER_MODULE = "verl.workers.rollout.vllm_rollout.utils"


class _State:
    installed = False
    errors: dict[str, str] = {}
    used_logged = False


STATE = _State()


def verl_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("verl")
    except Exception:
        return None


def _version_supported(v: str | None) -> bool:
    if v is None:
        return False
    try:
        from packaging.version import Version

        return Version("0.9.1") <= Version(v) < Version("0.10")
    except Exception:
        return False


def _wrap(fn, replacement):
    """``replacement(original, *a, **kw)`` presented as ``fn``; wrapping a wrapper returns it unchanged."""
    if getattr(fn, _MARK, None) is not None:
        return fn

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return replacement(fn, *args, **kwargs)

    setattr(wrapper, _MARK, fn)
    return wrapper


# ---------------------------------------------------------------------------------------------------
# Replacements


def _rollout_correction(original, batch, rollout_corr_config, *args, **kwargs):
    method = check_method(rollout_corr_config)
    if method is None:
        return original(batch, rollout_corr_config, *args, **kwargs)
    if not STATE.used_logged:
        STATE.used_logged = True
        logger.info("interq: %s.rollout_is=%s computed by interq (verl's RS and metrics kept)", CONFIG_PATH, method)
    return compute_interq_correction_and_add_to_batch(batch, rollout_corr_config, verl_fn=original)


def _bypass(original, batch, rollout_corr_config=None, *args, **kwargs):
    check_method(rollout_corr_config)  # raises for an interq method in bypass mode
    return original(batch, rollout_corr_config, *args, **kwargs)


def _algorithm_rollout_corr(config: Any) -> Any:
    alg = config.get("algorithm", None) if hasattr(config, "get") else getattr(config, "algorithm", None)
    if alg is None:
        return None
    return alg.get("rollout_correction", None) if hasattr(alg, "get") else getattr(alg, "rollout_correction", None)


def check_verl_config(config: Any) -> str | None:
    """Fail fast on a verl config that selects an interq method it cannot run. Returns the method or None."""
    rc = _algorithm_rollout_corr(config)
    method = check_method(rc)
    if method is None:
        return None
    ensure_patched()
    try:
        calc = config.actor_rollout_ref.rollout.get("calculate_log_probs", True)
    except Exception:
        calc = True
    if calc is False:
        raise InterqVerlError(
            f"{CONFIG_PATH}.rollout_is={method!r} needs the rollout engine's log-probs (behavior_logprobs), but "
            "actor_rollout_ref.rollout.calculate_log_probs=false: verl would skip the rollout correction "
            "silently. Set actor_rollout_ref.rollout.calculate_log_probs=true."
        )
    return method


def _validate_config(original, config, *args, **kwargs):
    from interq.integrations.verl.w8a8 import check_rollout_config

    check_rollout_config(config)
    check_verl_config(config)
    return original(config, *args, **kwargs)


def _check_weights_present(data: Any, algo_config: Any) -> None:
    rc = algo_config.get("rollout_correction", None) if hasattr(algo_config, "get") else None
    method = check_method(rc)
    if method is None or data is None or not hasattr(data, "batch"):
        return
    keys = data.batch.keys()
    if "rollout_is_weights" not in keys:
        why = ("the batch has no 'rollout_log_probs' (set actor_rollout_ref.rollout.calculate_log_probs=true)"
               if "rollout_log_probs" not in keys else "verl did not call its rollout-correction hook")
        raise InterqVerlError(
            f"{CONFIG_PATH}.rollout_is={method!r}, but the batch reached the advantage step without "
            f"rollout_is_weights: {why}. Training on would silently drop the InterQ correction."
        )


def _advantage(original, data, *args, **kwargs):
    _check_weights_present(data, kwargs.get("config"))
    return original(data, *args, **kwargs)


# ---------------------------------------------------------------------------------------------------
# Hooks


def _patch_helper(module: ModuleType) -> None:
    fn = getattr(module, HELPER_FN, None)
    if fn is None:
        msg = (f"verl {verl_version()} has no {HELPER_MODULE}.{HELPER_FN} (interq's verl plugin is tested with "
               f"verl{SUPPORTED_VERL}); rollout_is={'|'.join(INTERQ_METHODS)} cannot run")
        STATE.errors["rollout_corr"] = msg
        logger.warning("interq: %s", msg)
        return
    STATE.errors.pop("rollout_corr", None)
    wrapped = _wrap(fn, _rollout_correction)
    setattr(module, HELPER_FN, wrapped)
    import sys

    for name in _BINDERS:  # modules imported before the plugin hold verl's function by name
        mod = sys.modules.get(name)
        if mod is not None and getattr(mod, HELPER_FN, None) is fn:
            setattr(mod, HELPER_FN, wrapped)
    bypass = getattr(module, BYPASS_FN, None)
    if bypass is not None:
        setattr(module, BYPASS_FN, _wrap(bypass, _bypass))


def _patch_attr(name: str, replacement):
    def hook(module: ModuleType) -> None:
        fn = getattr(module, name, None)
        if fn is None:
            logger.warning("interq: verl %s has no %s.%s; that guard is off", verl_version(), module.__name__, name)
            return
        setattr(module, name, _wrap(fn, replacement))

    hook.__name__ = f"patch_{name}"
    return hook


_patch_validate = _patch_attr("validate_config", _validate_config)
_patch_advantage_v0 = _patch_attr("compute_advantage", _advantage)
_patch_advantage_v1 = _patch_attr("compute_advantage_for_multi_trajectories", _advantage)


def _register_engine(module: ModuleType) -> None:
    from interq.integrations.verl.engine import register_engine

    try:
        register_engine()
    except Exception as e:  # never break verl's import in a process that does not use the engine
        STATE.errors["engine"] = f"{type(e).__name__}: {e}"
        logger.warning("interq: could not register the aligned engine: %s", e)


def _register_agent_loop(module: ModuleType) -> None:
    try:
        import interq.integrations.verl.agent_loop  # noqa: F401 - its @register adds ``interq_env``
    except Exception as e:  # never break verl's import in a process that does not use the loop
        STATE.errors["agent_loop"] = f"{type(e).__name__}: {e}"
        logger.warning("interq: could not register the interq_env agent loop: %s", e)


def _register_w8a8(module: ModuleType) -> None:
    try:
        from interq.integrations.verl import vllm_w8a8

        (vllm_w8a8.patch_vllm_worker if module.__name__ == VLLM_WORKER_MODULE else vllm_w8a8.patch_vllm_server)(module)
    except Exception as e:  # never break verl's import in a process that does not use the int8 rollout
        STATE.errors["w8a8"] = f"{type(e).__name__}: {e}"
        logger.warning("interq: could not add the w8a8_int8 rollout quantization: %s", e)


def ensure_patched() -> None:
    """Import verl's rollout-correction module (running the hook) and raise if InterQ cannot run on it."""
    import importlib

    install()
    try:
        importlib.import_module(HELPER_MODULE)
    except ImportError as e:
        raise InterqVerlError(
            f"verl {verl_version()} has no module {HELPER_MODULE} ({e}); interq's verl plugin is tested with "
            f"verl{SUPPORTED_VERL}"
        ) from e
    if "rollout_corr" in STATE.errors:
        raise InterqVerlError(STATE.errors["rollout_corr"])


def install() -> None:
    """Install the plugin's hooks (idempotent). Called on import of this module."""
    if STATE.installed:
        return
    STATE.installed = True
    v = verl_version()
    if v is None:
        logger.warning("interq: verl is not installed; the verl plugin's hooks wait for a verl import")
    elif not _version_supported(v):
        logger.warning("interq: verl %s is outside the tested range verl%s; the plugin may not apply", v, SUPPORTED_VERL)
    _hooks.when_imported(HELPER_MODULE, _patch_helper)
    _hooks.when_imported("verl.utils.config", _patch_validate)
    _hooks.when_imported("verl.trainer.ppo.ray_trainer", _patch_advantage_v0)
    _hooks.when_imported("verl.trainer.ppo.v1.utils", _patch_advantage_v1)
    _hooks.when_imported("verl.workers.engine.fsdp.transformer_impl", _register_engine)
    _hooks.when_imported(AGENT_LOOP_MODULE, _register_agent_loop)
    _hooks.when_imported(VLLM_SERVER_MODULE, _register_w8a8)
    _hooks.when_imported(VLLM_WORKER_MODULE, _register_w8a8)
    logger.info("interq: verl plugin loaded (verl %s; rollout_is=%s)", v, "|".join(INTERQ_METHODS))


install()
