"""Every ``INTERQ_*`` environment variable interq or its scripts read, with the values each accepts.

A switch set to a value outside its list is refused in one line naming the variable and the accepted values (it is
never read as "on"), and so is an ``INTERQ_*`` name that is not in this table (a misspelt switch would otherwise do
nothing): :func:`check_environment` runs before any command that writes a run does any work, and each module reads
its switch through :func:`flag` / :func:`choice` / :func:`value`, which refuse the same way.

=========================== ============================================= ========================================
variable                    values                                        what it does
=========================== ============================================= ========================================
``INTERQ_ALLOCATOR``        ``auto`` (default), ``jemalloc``, ``system``  the memory allocator of a long command
                                                                          (:mod:`interq.allocator`)
``INTERQ_CPU_KERNELS``      on: ``1`` (default) ``on`` ``true`` ``yes``;   interq's compiled CPU kernels
                            off: ``0`` ``off`` ``false`` ``no``            (:mod:`interq.kernels`)
``INTERQ_FAST_LAYERS``      as ``INTERQ_CPU_KERNELS`` (default on)        the rollout's lean decoder-layer forward
``INTERQ_FLASH_DECODE``     as ``INTERQ_CPU_KERNELS`` (default on)        the one-call flash decode attention
``INTERQ_KERNELS_DIR``      a directory path (default                     where the CPU kernels are built; one
                            ``~/.cache/interq/kernels``)                  that cannot be used is said once, and
                                                                          the eager ops run
``INTERQ_KERNELS_MARCH``    ``native`` (default), ``x86-64-v2``,          the CPU class the kernels are built
                            ``x86-64-v3``, ``x86-64-v4``, ``cascadelake``  for: a lower one's code on this CPU
``INTERQ_CACHE``            a directory path (default ``~/.cache/interq``)  offline data (SmolLM2, ALFWorld)
``INTERQ_VERL_ALIGN``       ``fp8_block128`` (default), ``w8a8_int8``,    the verl engine's aligned forward
                            ``w8a8_int8_kv_int8``, ``w8a8_int8_kv_fp8``,
                            ``none``, or a JSON object of QuantConfig
                            fields
``INTERQ_VERL_LOG_LEVEL``   ``DEBUG`` ``INFO`` (default) ``WARNING``      the verl plugin's log level
                            ``ERROR`` ``CRITICAL``
``INTERQ_REQUIRE_ENGINES``  as ``INTERQ_CPU_KERNELS`` (default off)       tests: a skipped engine test fails
``INTERQ_TEST_THREADS``     a positive integer (default 2)                tests: torch threads
``INTERQ_VENV``             a directory path (default ``.venv``)          scripts/setup.sh: the venv to build
``INTERQ_CONSTRAINTS``      a file path or ``none`` (default              scripts/setup.sh: the pinned versions
                            ``constraints.txt``)                          (``none``: unpinned)
``INTERQ_VLLM_VENV``        a directory path                              benchmarks: vLLM's venv
``INTERQ_TORCH_CPU_INDEX``  a URL                                         scripts: torch's CPU wheel index
``INTERQ_TORCH_CUDA_INDEX`` a URL                                         scripts: torch's CUDA wheel index
``INTERQ_GPU_RUNS``         a directory path                              scripts/gpu_check.sh: its output
=========================== ============================================= ========================================
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping

from interq.errors import ConfigError

ON = ("1", "on", "true", "yes")
OFF = ("0", "off", "false", "no")


class SwitchError(ConfigError):
    """An ``INTERQ_*`` environment variable with a value it does not accept (or an unknown ``INTERQ_*`` name)."""


def _bool(default: bool, what: str) -> dict:
    return {"kind": "bool", "default": default, "what": what}


def _choice(values: tuple[str, ...], default: str, what: str, case: str = "lower") -> dict:
    return {"kind": "choice", "values": values, "default": default, "what": what, "case": case}


def _path(default: str | None, what: str) -> dict:
    return {"kind": "path", "default": default, "what": what}


# the verl engine's aligned presets (interq.integrations.verl.engine.PRESETS; a test keeps the two lists equal)
VERL_ALIGN_PRESETS = ("fp8_block128", "w8a8_int8", "w8a8_int8_kv_int8", "w8a8_int8_kv_fp8", "none")

REGISTRY: dict[str, dict] = {
    "INTERQ_ALLOCATOR": _choice(("auto", "jemalloc", "system"), "auto", "the memory allocator of a long command"),
    "INTERQ_CPU_KERNELS": _bool(True, "interq's compiled CPU kernels"),
    "INTERQ_FAST_LAYERS": _bool(True, "the rollout's lean decoder-layer forward"),
    "INTERQ_FLASH_DECODE": _bool(True, "the one-call flash decode attention"),
    "INTERQ_KERNELS_DIR": _path("~/.cache/interq/kernels", "where the CPU kernels are built"),
    # interq.kernels.MARCH_TARGETS' keys (a test keeps the two lists equal)
    "INTERQ_KERNELS_MARCH": _choice(("native", "x86-64-v2", "x86-64-v3", "x86-64-v4", "cascadelake"), "native",
                                    "the CPU class the kernels are built for"),
    "INTERQ_CACHE": _path("~/.cache/interq", "offline data (SmolLM2, ALFWorld)"),
    "INTERQ_VERL_ALIGN": {"kind": "verl_align", "default": "fp8_block128", "what": "the verl engine's aligned forward"},
    "INTERQ_VERL_LOG_LEVEL": _choice(("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"), "INFO",
                                     "the verl plugin's log level", case="upper"),
    "INTERQ_REQUIRE_ENGINES": _bool(False, "tests: a test skipped for a missing engine fails"),
    "INTERQ_TEST_THREADS": {"kind": "posint", "default": "2", "what": "tests: torch threads"},
    "INTERQ_VENV": _path(".venv", "scripts/setup.sh: the virtual environment to build"),
    "INTERQ_CONSTRAINTS": _path(None, "scripts/setup.sh: the constraints file of the versions to install, or none"),
    "INTERQ_VLLM_VENV": _path(None, "benchmarks: vLLM's virtual environment"),
    "INTERQ_TORCH_CPU_INDEX": {"kind": "url", "default": None, "what": "scripts: torch's CPU wheel index"},
    "INTERQ_TORCH_CUDA_INDEX": {"kind": "url", "default": None, "what": "scripts: torch's CUDA wheel index"},
    "INTERQ_GPU_RUNS": _path(None, "scripts/gpu_check.sh: its output directory"),
}


def accepted(name: str) -> str:
    spec = REGISTRY[name]
    kind = spec["kind"]
    if kind == "bool":
        return f"one of {', '.join(ON + OFF)} (default {'1' if spec['default'] else '0'})"
    if kind == "choice":
        return f"one of {', '.join(spec['values'])} (default {spec['default']})"
    if kind == "verl_align":
        return f"{', '.join(VERL_ALIGN_PRESETS)} (default fp8_block128), or a JSON object of QuantConfig fields"
    if kind == "posint":
        return f"a positive integer (default {spec['default']})"
    if kind == "url":
        return "an http(s) URL"
    return "a directory path"


def _refuse(name: str, raw: str) -> SwitchError:
    return SwitchError(f"environment variable {name}={raw!r} is not accepted ({REGISTRY[name]['what']}); "
                       f"accepted: {accepted(name)}")


def _parse(name: str, raw: str):
    spec = REGISTRY[name]
    kind, v = spec["kind"], raw.strip()
    if kind == "bool":
        if v == "":
            return spec["default"]
        if v.lower() in ON:
            return True
        if v.lower() in OFF:
            return False
        raise _refuse(name, raw)
    if kind == "choice":
        if v == "":
            return spec["default"]
        v = v.lower() if spec["case"] == "lower" else v.upper()
        if v not in spec["values"]:
            raise _refuse(name, raw)
        return v
    if kind == "verl_align":
        if v in VERL_ALIGN_PRESETS or v == "":
            return v or spec["default"]
        try:
            obj = json.loads(v)
        except ValueError:
            raise _refuse(name, raw) from None
        if not isinstance(obj, dict):
            raise _refuse(name, raw)
        return v
    if kind == "posint":
        if v == "":
            return int(spec["default"])
        if not v.isdigit() or int(v) < 1:
            raise _refuse(name, raw)
        return int(v)
    if kind == "url":
        if not v.startswith(("http://", "https://", "file://")):
            raise _refuse(name, raw)
        return v
    if v == "" or "\0" in v:  # path
        raise _refuse(name, raw)
    return os.path.expanduser(v)


def value(name: str, environ: Mapping[str, str] | None = None):
    """The parsed value of switch ``name`` (its default when unset); :class:`SwitchError` for a value it does not
    accept."""
    env = os.environ if environ is None else environ
    raw = env.get(name)
    if raw is None:
        d = REGISTRY[name]["default"]
        if REGISTRY[name]["kind"] == "path" and d is not None:
            return os.path.expanduser(d)
        if REGISTRY[name]["kind"] == "posint":
            return int(d)
        return d
    return _parse(name, raw)


def flag(name: str, environ: Mapping[str, str] | None = None) -> bool:
    """An on/off switch: True or False; :class:`SwitchError` for anything but the accepted spellings."""
    assert REGISTRY[name]["kind"] == "bool", name
    return bool(value(name, environ))


def check_environment(environ: Mapping[str, str] | None = None) -> None:
    """Refuse (one :class:`SwitchError` naming every problem) an ``INTERQ_*`` variable this table does not list or
    whose value it does not accept."""
    env = os.environ if environ is None else environ
    problems = []
    for name in sorted(k for k in env if k.startswith("INTERQ_")):
        if name not in REGISTRY:
            problems.append(f"environment variable {name} is not one of interq's switches "
                            f"({', '.join(sorted(REGISTRY))}); unset it")
            continue
        try:
            _parse(name, env[name])
        except SwitchError as e:
            problems.append(str(e))
    if problems:
        raise SwitchError("; ".join(problems))


def table() -> list[tuple[str, str, str]]:
    """(variable, accepted values, what it does) for every switch: the documentation's table."""
    return [(n, accepted(n), s["what"]) for n, s in sorted(REGISTRY.items())]
