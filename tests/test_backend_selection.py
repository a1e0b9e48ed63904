"""A CPU gets the int8 backend and kernels its instruction set calls for, read here from /proc/cpuinfo and the Linux
kernel, not from the code under test.

The VNNI, AMX and AVX2 tests skip where their backend is not available, so a regression in how the kernels are
built or the backend is chosen (a flag misread, a build without ``-march=native``, a failed AMX permission request)
would turn hundreds of tests into skips and leave the suite green. These tests fail instead: a CPU with AVX512-VNNI
must get ``vnni`` (or ``amx``), one with AMX-INT8 that the kernel lets a process use must get ``amx``, an AVX2 CPU
without AVX-512 must get ``avx2``.
"""

from __future__ import annotations

import ctypes
import os
import platform
from pathlib import Path

import pytest
import torch

from interq import kernels
from interq.quant.linear import resolve_int8_backend

pytestmark = pytest.mark.skipif(platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"),
                                reason="reads /proc/cpuinfo of an x86-64 Linux machine")


def cpu_flags() -> set[str]:
    """The flags of the first CPU in /proc/cpuinfo (every CPU of a machine has the same)."""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def linux_grants_amx_tiles() -> bool:
    """Whether the Linux kernel lets this process use AMX tile data: ``arch_prctl(ARCH_REQ_XCOMP_PERM,
    XFEATURE_XTILEDATA)`` (Linux 5.16+) returns 0. Asking twice is harmless (the permission is per process)."""
    sys_arch_prctl, arch_req_xcomp_perm, xfeature_xtiledata = 158, 0x1023, 18
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.syscall(sys_arch_prctl, arch_req_xcomp_perm, xfeature_xtiledata) == 0


def _kernels():
    """The compiled kernels; a skip where they are turned off, a failure where they do not build (a skip without a
    compiler, unless INTERQ_REQUIRE_ENGINES is set: `make test` requires them)."""
    if os.environ.get("INTERQ_CPU_KERNELS", "1").strip().lower() in ("0", "off", "false", "no"):
        pytest.skip("the CPU kernels are turned off (INTERQ_CPU_KERNELS)")
    mod = kernels.load()
    if mod is None:
        import shutil

        reason = kernels.status()["reason"]
        if shutil.which(os.environ.get("CXX", "c++")) is None and os.environ.get(
                "INTERQ_REQUIRE_ENGINES", "").strip().lower() in ("", "0", "false", "no", "off"):
            pytest.skip(f"no C++ compiler, the kernels are not built: {reason}")
        pytest.fail(f"interq's CPU kernels did not build or load here: {reason}")
    return mod


FLAGS = cpu_flags()
# the class the kernels are built for: this CPU's, or the lower one INTERQ_KERNELS_MARCH names (make test-isa)
KFLAGS = FLAGS if kernels.march() == "native" else set(kernels.MARCH_TARGETS[kernels.march()])
VNNI = {"avx512f", "avx512bw", "avx512vl", "avx512_vnni"} <= KFLAGS
AMX = VNNI and {"amx_tile", "amx_int8"} <= KFLAGS
AMX_BF16 = AMX and {"amx_bf16", "avx512_bf16"} <= KFLAGS
AVX2_ONLY = "avx2" in KFLAGS and "avx512f" not in KFLAGS


@pytest.mark.skipif(not VNNI, reason="this CPU has no AVX512-VNNI")
def test_a_cpu_with_avx512_vnni_gets_the_vnni_kernels_and_backend():
    mod = _kernels()
    assert mod.has_int8_gemm_vnni(), "the kernels were built without the VNNI GEMM on a CPU with AVX512-VNNI"
    assert resolve_int8_backend("vnni") == "vnni"
    assert resolve_int8_backend("auto") in ("vnni", "amx")


@pytest.mark.skipif(not AMX, reason="this CPU has no AMX-INT8")
def test_a_cpu_with_amx_int8_gets_the_amx_backend():
    mod = _kernels()
    if not linux_grants_amx_tiles():
        pytest.skip("the Linux kernel does not grant this process AMX tile data (arch_prctl refused)")
    assert mod.has_int8_gemm_amx(), "the kernels have no AMX GEMM on a CPU whose kernel grants AMX tiles"
    assert resolve_int8_backend("auto") == "amx"
    assert resolve_int8_backend("auto", torch.device("cpu")) == "amx"


@pytest.mark.skipif(not AMX_BF16, reason="this CPU has no AMX-BF16")
def test_a_cpu_with_amx_bf16_gets_the_amx_bf16_kernels():
    mod = _kernels()
    if not linux_grants_amx_tiles():
        pytest.skip("the Linux kernel does not grant this process AMX tile data (arch_prctl refused)")
    assert mod.has_bf16_gemm_amx(), "the kernels have no AMX-BF16 linear on a CPU with AMX-BF16 and AVX512-BF16"


@pytest.mark.skipif(not AVX2_ONLY, reason="this CPU is not an AVX2 CPU without AVX-512")
def test_an_avx2_cpu_without_avx512_gets_the_avx2_backend():
    mod = _kernels()
    if torch.backends.cpu.get_cpu_capability() != "AVX2":
        pytest.skip(f"torch runs at capability {torch.backends.cpu.get_cpu_capability()} here (ATEN_CPU_CAPABILITY?)")
    assert mod.has_int8_gemm_avx2() and not mod.has_int8_gemm_vnni()
    assert resolve_int8_backend("auto") == "avx2"


def test_the_machine_record_names_the_class_of_the_flags():
    from interq.machine import cpu_capability

    want = ("amx" if {"amx_int8", "amx_bf16"} & FLAGS else "avx512_vnni" if "avx512_vnni" in FLAGS
            else "avx512" if "avx512f" in FLAGS else "avx2" if "avx2" in FLAGS else "other")
    cap = cpu_capability()
    assert cap["cpu_class"] == want
    assert cap["native_bf16"] == bool({"avx512_bf16", "amx_bf16"} & FLAGS)


def test_the_kernels_build_for_the_class_interq_kernels_march_names():
    from interq import switches

    assert set(switches.REGISTRY["INTERQ_KERNELS_MARCH"]["values"]) == {"native", *kernels.MARCH_TARGETS}
    assert kernels.isa_flags() == KFLAGS
    assert f"-march={kernels.march()}" in kernels._flags(True)
    v2, v3, v4, clx = (kernels.MARCH_TARGETS[t] for t in ("x86-64-v2", "x86-64-v3", "x86-64-v4", "cascadelake"))
    assert v2 < v3 < v4 < clx and "avx2" in v3 - v2 and "avx512f" in v4 - v3 and clx - v4 == {"avx512_vnni"}


def test_a_build_for_a_class_above_this_cpu_is_refused_before_compiling(monkeypatch):
    monkeypatch.setenv("INTERQ_KERNELS_MARCH", "cascadelake")
    monkeypatch.setattr(kernels, "_host_flags", lambda: set(kernels.MARCH_TARGETS["x86-64-v3"]))
    why = kernels._march_refused()
    assert why is not None and "INTERQ_KERNELS_MARCH=cascadelake" in why and "avx512_vnni" in why
    monkeypatch.setenv("INTERQ_KERNELS_MARCH", "x86-64-v2")
    assert kernels._march_refused() is None
    monkeypatch.setenv("INTERQ_KERNELS_MARCH", "zen9")
    from interq.switches import SwitchError

    with pytest.raises(SwitchError, match="INTERQ_KERNELS_MARCH"):
        kernels.march()
