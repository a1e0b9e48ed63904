"""Every instruction-set branch of the C++ kernels compiles, whatever CPU runs the tests.

The kernels are built on each machine with ``-march=native``, so a machine compiles only its own ``#if`` branches: an
edit to the AVX2 tiles would first fail to compile on an AVX2 user's machine. Here each source file under the kernels'
``csrc`` folder (with the topic headers it includes) is compiled for one target of each CPU class, with the flags and
include paths of the real build (torch's ``cpp_extension`` writes them, as for ``interq.kernels``' build, and only
``-march`` changes), to an object file (``-c``: code generation and the assembler run, not only the parser), the targets
in parallel:

- ``x86-64-v2``: no AVX2 (the scalar and SSE code);
- ``x86-64-v3``: AVX2 + FMA (AMD Zen 2/3, Intel client CPUs: the ``avx2`` int8 backend, the AVX2 bf16 linear);
- ``x86-64-v4``: AVX-512 F/BW/DQ/VL without VNNI;
- ``cascadelake``: AVX-512 with VNNI and no native bf16 (the ``vnni`` backend without AMX);
- ``sapphirerapids``: AVX-512 VNNI + BF16 and AMX (the ``amx`` backend, the AMX bf16 and flash-decode kernels).

Skipped only where there is no C++ compiler (and then a failure under ``INTERQ_REQUIRE_ENGINES=1``, as ``make test``
sets it: CI must compile them).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from interq import kernels

MARCHES = ("x86-64-v2", "x86-64-v3", "x86-64-v4", "cascadelake", "sapphirerapids")
CSRC = Path(kernels.__file__).with_name("csrc")


def _require() -> bool:
    return os.environ.get("INTERQ_REQUIRE_ENGINES", "").strip().lower() not in ("", "0", "false", "no", "off")


def _compiler() -> str:
    cxx = os.environ.get("CXX", "c++")  # what torch's cpp_extension calls
    if shutil.which(cxx) is None:
        msg = f"no C++ compiler ({cxx!r} is not on PATH): the kernels' instruction-set branches cannot be compiled"
        if _require():
            pytest.fail(msg + " (INTERQ_REQUIRE_ENGINES is set: CI must compile them)")
        pytest.skip(msg)
    return cxx


def build_cflags(tmp: Path) -> list[str]:
    """The compile flags of interq's kernel build (the ``cflags`` line torch's cpp_extension writes into its ninja
    file for the same extra flags), with ``-march=native`` left in for the caller to replace."""
    from torch.utils import cpp_extension as ce

    extra = list(kernels._flags(True))
    try:
        ce._write_ninja_file_to_build_library(str(tmp / "build.ninja"), "interq_isa_check", [str(tmp / "main.cpp")],
                                              extra, [], [], [], [], False, False, False)
        line = next(x for x in (tmp / "build.ninja").read_text().splitlines() if x.startswith("cflags = "))
        return shlex.split(line[len("cflags = "):])
    except (AttributeError, TypeError, StopIteration):  # torch's private writer changed: the same flags by hand
        import sysconfig

        inc = [*ce.include_paths("cpu"), sysconfig.get_path("include", scheme="posix_prefix")]
        return ["-DTORCH_EXTENSION_NAME=interq_isa_check", "-DTORCH_API_INCLUDE_EXTENSION_H",
                *[a for p in inc for a in ("-isystem", p)], "-fPIC", "-std=c++20", *extra]


def test_the_check_uses_the_real_builds_flags(tmp_path):
    flags = build_cflags(tmp_path)
    assert "-march=native" in flags and "-ffp-contract=off" in flags and "-O3" in flags
    assert any(f.startswith("-std=c++") for f in flags) and "-DTORCH_API_INCLUDE_EXTENSION_H" in flags
    assert any(Path(f, "torch", "extension.h").is_file() for f in flags)  # torch's headers are on the include path


@pytest.mark.slow
@pytest.mark.timeout(3600)  # five -O3 builds of the kernels, about 1-3 minutes each per core
def test_every_isa_branch_of_the_kernels_compiles(tmp_path):
    cxx = _compiler()
    sources = sorted(CSRC.glob("*.cpp"))
    assert sources, f"no C++ sources in {CSRC}"
    flags = build_cflags(tmp_path)
    jobs = []
    for src in sources:
        main = tmp_path / f"{src.stem}.main.cpp"  # what load_inline compiles: torch's extension header, then the source
        main.write_text("#include <torch/extension.h>\n" + src.read_text())
        for march in MARCHES:
            out = tmp_path / f"{src.stem}.{march}.o"
            cmd = [cxx, *[f"-march={march}" if f == "-march=native" else f for f in flags], "-I", str(CSRC), "-c",
                   str(main), "-o", str(out)]
            jobs.append((src.name, march, out, cmd))

    def run(job):
        name, march, out, cmd = job
        r = subprocess.run(cmd, capture_output=True, text=True)
        return name, march, out, r

    with ThreadPoolExecutor(max_workers=max(1, min(len(jobs), os.cpu_count() or 1))) as pool:
        results = list(pool.map(run, jobs))
    failed = [f"{name} -march={march}:\n" + "\n".join(r.stderr.strip().splitlines()[-15:])
              for name, march, out, r in results if r.returncode != 0 or not out.is_file() or out.stat().st_size == 0]
    assert not failed, "kernel sources that do not compile for every CPU class:\n" + "\n\n".join(failed)


def test_each_target_enables_the_branches_it_stands_for():
    """The targets above differ in the instruction sets the kernels' ``#if`` branches test (a compiler that mapped two
    of them to the same set would leave a branch uncompiled)."""
    cxx = _compiler()
    want = {"x86-64-v2": (set(), {"__AVX2__", "__AVX512F__"}),
            "x86-64-v3": ({"__AVX2__", "__FMA__"}, {"__AVX512F__"}),
            "x86-64-v4": ({"__AVX512F__", "__AVX512BW__"}, {"__AVX512VNNI__"}),
            "cascadelake": ({"__AVX512VNNI__"}, {"__AVX512BF16__", "__AMX_TILE__"}),
            "sapphirerapids": ({"__AVX512VNNI__", "__AVX512BF16__", "__AMX_TILE__", "__AMX_INT8__", "__AMX_BF16__"},
                               set())}
    for march, (on, off) in want.items():
        r = subprocess.run([cxx, f"-march={march}", "-dM", "-E", "-x", "c++", os.devnull], capture_output=True, text=True)
        assert r.returncode == 0, f"{cxx} does not know -march={march}: {r.stderr.strip()[-300:]}"
        defined = set(re.findall(r"#define (__\w+__)", r.stdout))
        assert on <= defined and not (off & defined), (march, sorted(on - defined), sorted(off & defined))


def test_each_kernel_source_stays_short_enough_to_read():
    """The kernels are split by topic: no C++ file of the kernels' folder is over 800 lines."""
    long = {p.name: n for p in sorted(CSRC.iterdir()) if p.suffix in (".cpp", ".h")
            for n in [len(p.read_text().splitlines())] if n > 800}
    assert not long, f"C++ sources over 800 lines (split them by topic): {long}"
