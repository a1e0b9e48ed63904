"""interq: RL for multi-turn LLM agents with quantized rollouts and the InterQ-RL history correction.

Layout (imports flow downwards only; ``interq.algo`` imports nothing else from interq):

- ``interq.algo``         pure tensor math: corrections, advantages, loss, metrics
- ``interq.quant``        the W8A8-KV8 executor numerics, weight sync, aligned learner forward
- ``interq.rollout``      the multi-turn rollout engine (KV cache kept across turns, exact behavior log-probs)
- ``interq.envs``         environments (built-in household, ALFWorld, ScienceWorld, WebShop) and the worker pool
- ``interq.agent``        the agent loop joining engine and environments into trajectories
- ``interq.train``        policy, warm start, the RL loop, configs, checkpoints
- ``interq.integrations`` verl plugin
"""

from importlib import metadata as _metadata

try:
    __version__ = _metadata.version("interq")  # the version in pyproject.toml, as installed
except _metadata.PackageNotFoundError:  # run from a source tree that is not installed
    __version__ = "0+unknown"
