"""interq on verl: the InterQ correction and the aligned forward as a verl plugin (``interq[verl]``).

Switched on by verl's own config, no fork of verl's trainer (see docs/verl.md)::

    algorithm.rollout_correction.rollout_is=interq        # or interq_uniform, prefix_is
    +algorithm.rollout_correction.interq.budget=0.5       # options: interq.integrations.verl.correction
    VERL_ENGINE_VENDOR=interq                             # aligned fp8 block128 actor forward (engine)
    actor_rollout_ref.rollout.agent.default_agent_loop=interq_env    # interq's environments (agent_loop)
    actor_rollout_ref.rollout.quantization=w8a8_int8      # int8 W8A8 vLLM rollout (vllm_w8a8)

Modules (none imports verl at import time):

- ``plugin``      the ``verl.plugins`` entry point: importing it installs the hooks (idempotent)
- ``correction``  InterQ's weights and keep-mask on a verl batch, both layouts, ``rollout_corr/`` metrics
- ``engine``      the aligned-forward FSDP engine registered under vendor ``interq``
- ``env_loop``    one interq environment episode as one verl trajectory row (pure; no verl import)
- ``agent_loop``  the ``interq_env`` verl agent loop around it (imports verl; registered by the plugin)
- ``dataset``     ``python -m interq.integrations.verl.dataset``: the parquet rows of an environment's split
- ``w8a8``        the ``w8a8_int8`` rollout's numerics and bf16 -> compressed-tensors W8A8 int8 conversion
- ``vllm_w8a8``   its wiring into verl's vLLM server and weight sync (vLLM's layerwise reload)
"""

from interq.integrations.verl.correction import (
    INTERQ_METHODS,
    OPTION_NAMES,
    InterqVerlError,
    VerlInterqOptions,
    compute_interq_correction_and_add_to_batch,
    layout_ids,
    parse_options,
)

__all__ = [
    "INTERQ_METHODS",
    "OPTION_NAMES",
    "InterqVerlError",
    "VerlInterqOptions",
    "compute_interq_correction_and_add_to_batch",
    "install",
    "layout_ids",
    "parse_options",
]


def install() -> None:
    """Install the verl plugin's hooks now (what the ``verl.plugins`` entry point does on ``import verl``)."""
    from interq.integrations.verl.plugin import install as _install

    _install()
