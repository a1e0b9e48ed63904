"""What a measurement ran on: CPU model and capability, threads, torch, load, the int8 backend ``auto`` picks.

Every benchmark and every timed command records this beside its numbers (timings on a shared 2-core machine
depend on all of it):

    info = machine_info()            # at the start
    ...
    info["load_avg_end"] = load_avg()  # at the end

Pure reads of ``/proc`` and torch; no GPU or optional dependency needed.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

import torch

from interq import allocator

# lscpu / /proc/cpuinfo flag names of the features that decide CPU speed here
CPU_FEATURES = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_bf16", "amx_int8")


def _first_cpu() -> tuple[dict[str, str], set[str]]:
    """The first CPU's block of /proc/cpuinfo: (its "model name", "vendor_id", "cpu family", "model" and "stepping"
    fields, its flags); empty where not readable."""
    fields: dict[str, str] = {}
    flags: set[str] = set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if not key:  # the first CPU's block ends
                if fields:
                    break
                continue
            if key == "flags":
                flags = set(value.split())
            elif key in ("model name", "vendor_id", "cpu family", "model", "stepping"):
                fields.setdefault(key, value.strip())
    except OSError:
        pass
    return fields, flags


def _cpuinfo() -> tuple[str, set[str], str]:
    """(model name, flags, "family F model M stepping S") of the first CPU in /proc/cpuinfo; the platform's name,
    no flags and "" elsewhere. Family and model tell CPUs of one name apart (a VM's "AMD EPYC" covers several
    generations, whose bf16 and int8 throughput differ: family 26 is Zen 5)."""
    fields, flags = _first_cpu()
    ident = " ".join(f"{k.replace('cpu ', '')} {fields[k]}" for k in ("cpu family", "model", "stepping") if k in fields)
    return fields.get("model name") or platform.processor() or platform.machine(), flags, ident


def cpu_vendor() -> str:
    """The first CPU's ``vendor_id`` (``GenuineIntel``, ``AuthenticAMD``, ...; "" where /proc/cpuinfo is not
    readable)."""
    return _first_cpu()[0].get("vendor_id", "")


def cpu_has(flag: str) -> bool:
    """Whether the first CPU's /proc/cpuinfo flags include ``flag`` (e.g. ``avx512f``; False where not readable)."""
    return flag in _first_cpu()[1]


def _caches() -> str:
    """The first CPU's caches from sysfs, e.g. "L1d 48K, L1i 32K, L2 1024K, L3 32768K" ("" where not readable)."""
    out = []
    try:
        for d in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
            level, kind, size = ((d / f).read_text().strip() for f in ("level", "type", "size"))
            out.append(f"L{level}{ {'Data': 'd', 'Instruction': 'i'}.get(kind, '')} {size}")
    except OSError:
        return ""
    return ", ".join(out)


def load_avg() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def cpu_capability() -> dict:
    """The CPU's relevant features, the class it belongs to and torch's view of it.

    ``class``: ``amx`` > ``avx512_vnni`` > ``avx512`` > ``avx2`` > ``other``. ``native_bf16``: the CPU computes
    bf16 dot products in hardware (AVX512_BF16 or AMX); elsewhere torch emulates bf16 through fp32.
    """
    model, flags, ident = _cpuinfo()
    features = {f: f in flags for f in CPU_FEATURES}
    if features["amx_int8"] or features["amx_bf16"]:
        klass = "amx"
    elif features["avx512_vnni"]:
        klass = "avx512_vnni"
    elif features["avx512f"]:
        klass = "avx512"
    elif features["avx2"]:
        klass = "avx2"
    else:
        klass = "other"
    return {
        "cpu": model,
        "cpu_id": ident,
        "cpu_caches": _caches(),
        "cpu_class": klass,
        "cpu_features": [f for f in CPU_FEATURES if features[f]],
        "native_bf16": bool(features["avx512_bf16"] or features["amx_bf16"]),
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }


def host_info(device: str | torch.device | None = None) -> dict:
    """The machine a computation runs on, cheap to read: the CPU (model, identity, caches, class, features, native
    bf16), its CPU count, torch's threads and version, Python's version, ``device`` and, on a GPU, its name and
    compute capability. A training run keeps it in its ``machine.jsonl``."""
    dev = torch.device(device) if device is not None else torch.device("cpu")
    info = {
        **cpu_capability(),
        "cpu_count": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "device": str(dev),
    }
    if dev.type == "cuda" and torch.cuda.is_available():
        idx = dev.index if dev.index is not None else torch.cuda.current_device()
        info["gpu"] = torch.cuda.get_device_name(idx)
        info["gpu_capability"] = ".".join(map(str, torch.cuda.get_device_capability(idx)))
    return info


def machine_info(device: str | torch.device | None = None) -> dict:
    """Everything a benchmark's RESULT line records about where it ran (call at the start; add
    ``load_avg_end`` at the end): :func:`host_info`, the load average, the int8 backend ``auto`` takes, the
    allocator and the fused CPU kernels' status. ``device``: where the measured work ran."""
    from interq import kernels  # local: keeps this module light to import
    from interq.quant.linear import resolve_int8_backend

    info = host_info(device)
    dev = torch.device(info["device"])
    info.update({"load_avg_start": load_avg(), "int8_backend_auto": resolve_int8_backend("auto", dev),
                 "allocator": allocator.in_use()})
    if dev.type == "cpu":  # the fused CPU kernels of the int8 executor (built here if they can be)
        kernels.load()
        info["cpu_kernels"] = kernels.status()
    return info


def describe(info: dict) -> str:
    """One line for a benchmark's printed header."""
    feats = ",".join(info.get("cpu_features", [])) or "none"
    ident = "; ".join(x for x in (info.get("cpu_id"), info.get("cpu_caches")) if x)
    line = (f"{info.get('cpu')}{f' [{ident}]' if ident else ''} ({info.get('cpu_class')}: {feats}; "
            f"native bf16: {info.get('native_bf16')}), "
            f"{info.get('threads')} threads of {info.get('cpu_count')} CPUs, torch {info.get('torch')}, "
            f"load {info.get('load_avg_start')}, int8 backend auto = {info.get('int8_backend_auto')}, "
            f"allocator {info.get('allocator', 'system')}")
    if "cpu_kernels" in info:
        k = info["cpu_kernels"]
        line += f", fused CPU kernels: {'on' if k['loaded'] else 'off (' + str(k['reason']) + ')'}"
    if "gpu" in info:
        line += f", GPU {info['gpu']} (sm {info['gpu_capability']})"
    return line


DEVICES = ("auto", "cpu", "cuda")


def resolve_device(name: str | torch.device, field: str = "device") -> torch.device:
    """``auto`` -> ``cuda`` when a CUDA GPU is visible, else ``cpu``; ``cpu``; ``cuda`` / ``cuda:<i>`` (an error
    naming ``field`` when no GPU is visible). Anything else is an error naming ``field`` and the accepted values."""
    if isinstance(name, torch.device):
        name = str(name)
    if not isinstance(name, str) or not (name in DEVICES or (name.startswith("cuda:") and name[5:].isdigit())):
        raise ValueError(f"{field}={name!r} is not accepted; accepted: {', '.join(DEVICES)} or cuda:<index>")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"{field}={name!r}: no CUDA GPU is visible to torch {torch.__version__} "
                         f"(torch.version.cuda={torch.version.cuda}); use {field}=cpu or auto")
    return torch.device(name)


def synchronize(device: str | torch.device | None) -> None:
    """Wait for queued GPU work before reading a timer (a no-op on CPU)."""
    dev = torch.device(device) if device is not None else torch.device("cpu")
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def bf16_native(device: str | torch.device | None = None) -> bool:
    """bf16 GEMMs run in hardware here: a CUDA GPU of compute capability >= 8.0, or a CPU with AVX512_BF16/AMX."""
    dev = torch.device(device) if device is not None else torch.device("cpu")
    if dev.type == "cuda":
        return torch.cuda.is_available() and torch.cuda.get_device_capability(dev)[0] >= 8
    return cpu_capability()["native_bf16"]
