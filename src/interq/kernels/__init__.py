"""interq's compiled CPU kernels (the bottom room: the executor, the rollout and the learner call them through
this module): one pass over memory where the eager path runs a chain of ops.

At decode sizes (16 rows) the executor's quantized linear is bound by per-op overhead, not arithmetic: the
activation quantizer is ~7 eager ops, the epilogue 3 and each fused member's cast one more, at 2-5 us each.
``csrc/kernels.cpp`` (one translation unit; a header per topic beside it) does each of these in one call, with the
same values bit for bit (same float operations in the same order, compiled with ``-ffp-contract=off``;
tests/test_quant_kernels.py):

- ``quant_act_int8(x, qmax)`` = ``primitives.quant_act_int8_token(x, "half_even", bits)``
- ``epilogue(acc, s_a, s_w, sizes, dtype)`` = ``linear.epilogue`` (no bias) per member of a fused group
- ``int8_gemm_vnni(a, packed, n)`` = ``torch._int_mm(a, w_t)`` for weights packed once by ``pack_int8_vnni(w_t)``
  (AVX512-VNNI builds only: ``has_int8_gemm_vnni()``): the exact int32 accumulator, for few rows (decode), where
  ``_int_mm`` streams the weights at half the memory's speed; threads through torch's ``at::parallel_for``
  (OpenMP: the extension links the ``libgomp`` torch has loaded; where a build with ``-fopenmp`` fails, the kernels
  are built without it and that GEMM runs on one thread, which :func:`status` says)
- ``int8_gemm_avx2(a, packed, n)`` (AVX2 builds: ``has_int8_gemm_avx2()``): the same accumulator from the same packed
  weights on CPUs without VNNI, the codes widened to int16 and multiplied by ``vpmaddwd`` (exact), any number of rows:
  the ``avx2`` backend, where ``_int_mm`` takes a slow reference path and ``fp32_exact`` reads the codes as fp32
- ``int8_gemm_amx(a, packed, n)``: the same accumulator from the same packed weights by AMX-INT8 tiles, for any
  number of rows (K a multiple of 64; AMX builds on Linux only: ``has_int8_gemm_amx()``, which also asks the kernel
  for the tiles): the ``amx`` backend, 3x the VNNI kernel and 3.7x ``_int_mm`` at prefill sizes on one core
- ``int8_linear_amx(x, packed, s_w, sizes, qmax, dtype)``: ``quant_act_int8``, ``int8_gemm_amx`` and ``epilogue``
  in one call (the rows quantized over the threads, each accumulator block turned into the members' outputs in
  cache), the same values: the ``amx`` backend's whole linear where it applies (:func:`interq.quant.linear.whole_linear`)
- ``torch_row_sums(x, lanes)`` / ``rms_norm_bf16(x, w, eps, lanes)``: torch's CPU float sum of each row in torch's own
  order (its vectors of ``lanes`` floats, accumulators and cascade), and transformers' Llama / Qwen RMSNorm of bf16
  rows with that sum, bit for bit (:mod:`interq.kernels.rms_norm`)
- ``bf16_linear_amx(x, packed, n, bias, kb)``: a bf16 linear by AMX-BF16 tiles in fp32, K in blocks of ``kb``
  chunks of 32, rounded once (``has_bf16_gemm_amx()``): ``F.linear``'s bits where oneDNN sums in that order, which
  :mod:`interq.kernels.packed_linear` checks on a probe per shape, row count and thread count before using it
- ``flash_decode_amx(q, k, v, mask, scale)``: torch's CPU flash attention of bf16 decode problems ([B, H_kv, G, D]
  query rows over [B, H_kv, L, D] keys and values) in one call, bit for bit where oneDNN multiplies by AMX-BF16 tiles
  (AMX builds; 2 <= G <= 16, D a multiple of 32 up to 256; bool or bf16 masks: float32 masks are accepted but
  unverified against torch, which does not take them with a bf16 query): ``rollout.attention=sdpa_packed``'s decode
  where its probe agrees (:func:`interq.rollout.attention.flash_decode_matches`)
- ``causal_attention_fwd(q, k, v, scale)`` / ``causal_attention_bwd(...)``: the learner's causal self-attention and
  its gradient in fp32 (``train.learner_attention=kernel``, :mod:`interq.kernels.causal_attention`): to rounding (every
  other kernel here is bit for bit its eager chain)

The extension is compiled once per machine class with the C++ compiler torch's ``cpp_extension`` uses (about a
minute; ``scripts/setup.sh`` does it ahead; by hand: ``python -m interq.kernels``) into ``$INTERQ_KERNELS_DIR``
(default ``~/.cache/interq/kernels``), under a name that hashes the sources, the torch version, the CPU's
instruction-set flags (``-march=native``: a build is never loaded on a CPU it was not made for) and the virtual
environment. ``INTERQ_KERNELS_MARCH`` builds them for a lower CPU class instead (``x86-64-v3``: AVX2 and FMA, ...;
:data:`MARCH_TARGETS`), so that its branches run on this CPU (``make test-isa``). Where it cannot be built (no
compiler) the executor keeps the eager ops and says why in :func:`status`; ``INTERQ_CPU_KERNELS=0`` turns the
kernels off. Builds that no process has loaded for 30 days are removed when another one loads (:func:`prune`). They
never change a number, only the time (the learner's attention kernel aside: it runs where
``train.learner_attention=kernel`` asks, the default where the kernels build).
"""

from __future__ import annotations

import hashlib
import os
import sys
import threading
import time
from pathlib import Path

import torch

_CSRC = Path(__file__).with_name("csrc")
_SRC = _CSRC / "kernels.cpp"  # includes every header of _CSRC
_FLAGS = ["-O3", "-march=native", "-ffp-contract=off", "-fno-math-errno", "-fopenmp"]

# The lower CPU classes the kernels can be built for instead of the host's own (``INTERQ_KERNELS_MARCH``), so that
# their ``#if`` branches run, and are tested, on a CPU of a higher class: gcc's ``-march`` target -> the
# /proc/cpuinfo flags it compiles for (the host must have every one of them; the build then sees only these).
_V2 = frozenset({"sse4_1", "sse4_2", "ssse3", "popcnt"})
_V3 = _V2 | {"avx", "avx2", "fma", "f16c", "bmi1", "bmi2", "movbe", "abm"}
_V4 = _V3 | {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}
MARCH_TARGETS = {"x86-64-v2": _V2, "x86-64-v3": _V3, "x86-64-v4": _V4, "cascadelake": _V4 | {"avx512_vnni"}}
_LOCK = threading.Lock()
_STATE: dict = {"module": None, "tried": False, "reason": "not loaded yet", "build_s": None, "name": None}

def _switch_on() -> bool:
    from interq import switches

    return switches.flag("INTERQ_CPU_KERNELS")  # an unaccepted value is refused, never read as "on"


_ENABLED = {"value": _switch_on()}


def _cpu_flags() -> str:
    flags = _host_flags()
    if flags:
        return " ".join(sorted(f for f in flags if f.startswith(("avx", "sse", "fma", "f16c", "amx", "bmi"))))
    return torch.backends.cpu.get_cpu_capability()


def march() -> str:
    """The CPU class the kernels are built for: ``native`` (the host's, the default) or a key of
    :data:`MARCH_TARGETS` (``INTERQ_KERNELS_MARCH``)."""
    from interq import switches

    return switches.value("INTERQ_KERNELS_MARCH")


def _host_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def isa_flags() -> set[str]:
    """The CPU's /proc/cpuinfo flags as the kernels' build sees them: the host's, or under ``INTERQ_KERNELS_MARCH``
    those of its target (what a CPU of that class would report of the instruction sets the kernels look at)."""
    target = march()
    return _host_flags() if target == "native" else set(MARCH_TARGETS[target])


def _march_refused() -> str | None:
    """Why the build's target cannot run on this CPU (None: it can)."""
    target = march()
    if target == "native":
        return None
    missing = sorted(MARCH_TARGETS[target] - _host_flags())
    if missing:
        return (f"INTERQ_KERNELS_MARCH={target} needs CPU flags this CPU does not have ({', '.join(missing)}); "
                f"accepted here: native or one whose flags it has")
    return None


def _flags(openmp: bool) -> list[str]:
    flags = [f"-march={march()}" if f == "-march=native" else f for f in _FLAGS]
    return flags if openmp else [f for f in flags if f != "-fopenmp"]


def build_name(openmp: bool = True) -> str:
    """The extension's name: a hash of the sources, the flags, torch's version, the CPU's ISA flags and the venv."""
    h = hashlib.sha256()
    # sys.prefix: each virtual environment builds its own (its include paths are in the build file: two venvs
    # sharing one directory would rebuild it in turn)
    sources = b"".join(p.name.encode() + p.read_bytes() for p in sorted(_CSRC.iterdir())
                       if p.suffix in (".cpp", ".h"))
    for part in (sources, " ".join(_flags(openmp)).encode(), torch.__version__.encode(), _cpu_flags().encode(),
                 sys.version.encode(), sys.prefix.encode()):
        h.update(part)
    return "interq_int8_kernels_" + h.hexdigest()[:16]


def _ninja_on_path() -> None:
    """torch finds ninja on PATH; the ``ninja`` package installs it beside this interpreter, which is not on PATH when
    the virtual environment is used without being activated (``.venv/bin/python ...``)."""
    import shutil

    here = str(Path(sys.executable).parent)
    if shutil.which("ninja") is None and (Path(here) / "ninja").exists():
        os.environ["PATH"] = here + os.pathsep + os.environ.get("PATH", "")


def set_enabled(value: bool) -> None:
    """Use the kernels when they load (True, the default unless ``INTERQ_CPU_KERNELS=0``) or the eager ops."""
    _ENABLED["value"] = bool(value)


PRUNE_AFTER_DAYS = 30  # builds of other sources, flags, torch versions, CPUs or venvs not loaded for this long


def kernels_dir() -> Path:
    from interq import switches

    return Path(switches.value("INTERQ_KERNELS_DIR"))


def _unusable_dir() -> str | None:
    """Why the kernels directory cannot hold a build (None: it can): a file, a path under a file, not writable."""
    d = kernels_dir()
    p = d
    while not p.exists() and p != p.parent:
        p = p.parent
    if not p.is_dir():
        return f"{p} is a file, not a directory"
    if not os.access(p, os.W_OK | os.X_OK):
        return f"{p} is not writable"
    return None


def prune(keep: str, days: float = PRUNE_AFTER_DAYS) -> list[str]:
    """Remove the build directories beside ``keep`` that no process has loaded for ``days`` (each load touches its
    directory's ``last_used``; a directory without one counts from its own time). -> the names removed. Every
    source edit, torch upgrade or new venv leaves a build behind: without this the cache only grows."""
    import shutil

    root, cutoff, gone = kernels_dir(), time.time() - days * 86400, []
    for d in root.glob("interq_int8_kernels_*"):
        if d.name == keep or not d.is_dir():
            continue
        mark = d / "last_used"
        try:
            used = (mark if mark.exists() else d).stat().st_mtime
        except OSError:
            continue
        if used < cutoff and not (d / "lock").exists():  # never a build in progress
            shutil.rmtree(d, ignore_errors=True)
            gone.append(d.name)
    return gone


def _build(openmp: bool, verbose: bool):
    """-> (the build's name, the loaded module)."""
    name = build_name(openmp)
    build_dir = kernels_dir() / name
    _ninja_on_path()
    build_dir.mkdir(parents=True, exist_ok=True)
    with _build_lock(build_dir):
        if not (build_dir / f"{name}.so").is_file():
            print(f"[interq] compiling the int8 executor's CPU kernels into {build_dir} (once per machine, "
                  "about a minute)", file=sys.stderr, flush=True)
        return name, _load_inline(name, openmp, verbose, build_dir)


def _build_lock(build_dir: Path):
    """Builders of one directory take turns: each holds ``interq-build.lock`` (``flock``, released by the kernel
    when its process ends, however it ends) while torch builds or loads. Holding it, any ``lock`` file torch's own
    build left there belongs to a build that was killed (torch would wait on it for ever): it is removed, said in
    one line. Waiting for a live builder is said too, with its process id."""
    import contextlib
    import fcntl

    @contextlib.contextmanager
    def held():
        path = build_dir / "interq-build.lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                owner = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
                print(f"[interq] waiting for {owner}, which is building the CPU kernels in {build_dir}",
                      file=sys.stderr, flush=True)
                fcntl.flock(fd, fcntl.LOCK_EX)
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid {os.getpid()}".encode(), 0)
            stale = build_dir / "lock"
            if stale.exists():
                print(f"[interq] {stale}: a kernel build lock whose owner has ended (a build was killed); taken over",
                      file=sys.stderr, flush=True)
                stale.unlink(missing_ok=True)
            yield
        finally:
            os.close(fd)

    return held()


def _load_inline(name: str, openmp: bool, verbose: bool, build_dir: Path):
    from torch.utils.cpp_extension import load_inline

    return load_inline(name, cpp_sources=[_SRC.read_text()],
                       functions=["quant_act_int8", "epilogue", "has_int8_gemm_vnni", "pack_int8_vnni", "int8_gemm_vnni",
                                  "has_int8_gemm_avx2", "int8_gemm_avx2", "int8_linear_avx2",
                                  "has_int8_gemm_amx", "int8_gemm_amx", "int8_linear_amx",
                                  "has_bf16_gemm_amx", "bf16_linear_amx",
                                  "has_bf16_linear_avx2", "bf16_linear_avx2", "bf16_avx2_k_order",
                                  "flash_decode_amx", "torch_row_sums", "rms_norm_bf16",
                                  "causal_attention_fwd", "causal_attention_bwd"],
                       extra_cflags=_flags(openmp), extra_ldflags=["-fopenmp"] if openmp else [],
                       extra_include_paths=[str(_CSRC)],
                       build_directory=str(build_dir), verbose=verbose)


def load(verbose: bool = False):
    """The compiled module, building it on first use; None where it cannot be built or is turned off."""
    if not _ENABLED["value"]:
        return None
    if _STATE["tried"]:
        return _STATE["module"]
    with _LOCK:
        if _STATE["tried"]:
            return _STATE["module"]
        t0 = time.perf_counter()
        failed = []
        refused = _march_refused()
        if refused is not None:  # a build for a class above this CPU's would fault on its first instruction
            _STATE.update(tried=True, module=None, reason=refused)
            print(f"[interq] the CPU kernels are not built: {refused}; the eager ops run (the same numbers, slower)",
                  file=sys.stderr, flush=True)
            return None
        unusable = _unusable_dir()
        if unusable is not None:  # said once per process; the eager ops run (the same numbers, slower)
            _STATE.update(tried=True, module=None, reason=f"INTERQ_KERNELS_DIR={kernels_dir()}: {unusable}")
            print(f"[interq] the CPU kernels cannot be built or loaded: {_STATE['reason']}; the eager ops run "
                  "(the same numbers, slower)", file=sys.stderr, flush=True)
            return None
        for openmp in (True, False):  # without OpenMP (no omp.h / libgomp to link) int8_gemm_vnni runs one thread
            try:
                _STATE["name"], _STATE["module"] = _build(openmp, verbose)
                _STATE["reason"] = "loaded" if openmp else f"loaded without OpenMP (the first build: {failed[0]})"
                try:
                    (kernels_dir() / _STATE["name"] / "last_used").touch()
                    prune(_STATE["name"])
                except OSError:  # a read-only cache: nothing to mark or prune
                    pass
                break
            except Exception as e:  # no compiler, no headers, a failed build: the eager ops stay
                _STATE["module"] = None
                failed.append(f"{type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else ''}"[:300])
                _STATE["reason"] = failed[-1]
        _STATE["build_s"] = round(time.perf_counter() - t0, 1)
        _STATE["tried"] = True
    return _STATE["module"]


def get():
    """The loaded module when the kernels are on and built, else None (never builds: see :func:`load`)."""
    return _STATE["module"] if _ENABLED["value"] else None


def offers(flag: str, missing: str) -> tuple[bool, str]:
    """Whether the built kernels offer what their ``flag()`` function (``has_int8_gemm_vnni``, ...) reports, and why
    not: ``missing`` where the build lacks it, the load failure where there is no build."""
    mod = load()
    if mod is None:
        return False, f"interq's CPU kernels are not loaded ({status()['reason']})"
    if not getattr(mod, flag)():
        return False, missing
    return True, "available"


def set_module(root, name: str, new) -> None:
    """Put the module ``new`` at the dotted path ``name`` under ``root`` (an ``nn.Module``), in place of what was
    there."""
    parent, _, leaf = name.rpartition(".")
    setattr(root.get_submodule(parent) if parent else root, leaf, new)


def replace_modules(model, make) -> int:
    """Replace every submodule ``m`` of ``model`` for which ``make(m)`` gives a module (not None) by that module;
    returns how many were replaced (the executor's packed bf16 linears and fused RMSNorms are put in place so)."""
    n = 0
    for name, mod in list(model.named_modules()):
        new = make(mod)
        if new is not None:
            set_module(model, name, new)
            n += 1
    return n


def status() -> dict:
    """What a benchmark records: whether the kernels are on, loaded, and why not, and the class they are built for."""
    return {"enabled": _ENABLED["value"], "loaded": _STATE["module"] is not None, "reason": _STATE["reason"],
            "name": _STATE["name"], "load_s": _STATE["build_s"], "march": march()}


def main() -> int:
    """Build (or load) the kernels now and print :func:`status`; exit status 1 when they are not available."""
    mod = load(verbose="-v" in sys.argv)
    print(status())
    return 0 if mod is not None else 1
