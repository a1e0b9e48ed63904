"""The ``vnni`` int8 backend (interq.kernels' AVX512-VNNI GEMM for decode-size rows): the exact int32
accumulator of torch._int_mm for every shape, extreme codes and thread count, and executors bit-identical to the
int_mm backend's, before and after a weight sync; the module and executor tests also for the ``amx`` backend, which
uses the same packed weights (its GEMM's own tests: tests/test_quant_amx.py). Skipped on CPUs without AVX512-VNNI
(AMX-INT8 for ``amx``): the backend is not offered there; ``auto`` does not choose it. The ``avx2`` backend (its own
GEMM from the same packed weights, for CPUs without AVX-512) gets the same tests, on every CPU with AVX2."""

import pytest
import torch

from interq.quant import QuantConfig, make_executor
from interq import kernels
from interq.quant.linear import (INT8_BACKENDS, VNNI_MAX_M, FusedQuantLinear, QuantExperts, QuantLinear,
                                 amx_available, avx2_available, int8_accumulate, resolve_int8_backend,
                                 vnni_available, vnni_pack)
from interq.quant.testing import perturb_and_sync, tiny_causal_lm
from interq.quant.testing import random_codes as _codes, seeded_linear as _linear

AVAILABLE, WHY = vnni_available()
needs_vnni = pytest.mark.skipif(not AVAILABLE, reason=f"vnni backend: {WHY}")
AMX, WHY_AMX = amx_available()
AVX2, WHY_AVX2 = avx2_available()
needs_avx2 = pytest.mark.skipif(not AVX2, reason=f"avx2 backend: {WHY_AVX2}")
# the packed-weight backends; vnni's and avx2's modules see K = 44 (padded codes), amx's K = 128 (its own kernel
# needs K % 64)
PACKED = [pytest.param("vnni", 44, marks=needs_vnni),
          pytest.param("amx", 128, marks=pytest.mark.skipif(not AMX, reason=f"amx backend: {WHY_AMX}")),
          pytest.param("avx2", 44, marks=needs_avx2)]
# the GEMM kernels on pack_int8_vnni's layout that take any row count the tests give them
GEMMS = [pytest.param("int8_gemm_vnni", marks=needs_vnni), pytest.param("int8_gemm_avx2", marks=needs_avx2)]


def test_vnni_backend_is_validated_and_auto_prefers_it_where_available():
    assert "vnni" in INT8_BACKENDS
    if AVAILABLE:
        assert resolve_int8_backend("auto") == ("amx" if amx_available()[0] else "vnni")
        assert resolve_int8_backend("vnni") == "vnni"
    else:
        with pytest.raises(ValueError, match="int8_backend='vnni' cannot run here"):
            resolve_int8_backend("vnni")
    with pytest.raises(ValueError, match="int8_backend='vnni' cannot run here: it is a CPU kernel"):
        resolve_int8_backend("vnni", torch.device("cuda"))
    assert resolve_int8_backend("auto", torch.device("cuda")) == "int_mm"


@pytest.mark.parametrize("gemm", GEMMS)
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 7, 8, 12, 13, 16, 25, 64])
@pytest.mark.parametrize("k,n", [(576, 960), (8, 1), (64, 17), (1536, 576), (44, 33), (96, 48)])
@pytest.mark.parametrize("threads", [1, 2])
def test_packed_gemm_equals_int_mm_exactly(gemm, m, k, n, threads):
    """Every row-tile size (vnni: 1-12 rows, 16 = 8 + 8, 25 = 9 + 8 + 8; avx2: 1-3 rows, 4 = 2 + 2, 5 = 3 + 2),
    column tails of 1-15, one- and two-block panels, the extreme codes (-128 * -128 products, where the unsigned
    offset matters)."""
    a, w = _codes((m, k), seed=m * 1000 + k), _codes((k, n), seed=n)
    ref = a.long() @ w.long()
    mod = kernels.get()
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = getattr(mod, gemm)(a, vnni_pack(w), n)
    finally:
        torch.set_num_threads(before)
    assert got.dtype == torch.int32 and got.shape == (m, n)
    assert torch.equal(got.long(), ref)


@pytest.mark.parametrize("gemm", GEMMS)
def test_packed_gemm_at_the_worst_case_accumulator(gemm):
    """All products -128 * -128 (and -128 * 127) over K = 4096: 2^26 in magnitude, plus the 128 * rowsum offset."""
    k = 4096
    a = torch.full((3, k), -128, dtype=torch.int8)
    w = torch.full((k, 20), -128, dtype=torch.int8)
    w[:, 1] = 127
    ref = a.long() @ w.long()
    assert torch.equal(getattr(kernels.get(), gemm)(a, vnni_pack(w), 20).long(), ref)


@pytest.mark.parametrize("gemm", GEMMS)
def test_packed_gemm_refuses_bad_inputs_with_the_argument_named(gemm):
    mod = kernels.get()
    w = _codes((64, 32), 0)
    with pytest.raises(RuntimeError, match="K must be a multiple of 4"):
        mod.pack_int8_vnni(_codes((6, 32), 0))
    with pytest.raises(RuntimeError, match="a has K = 60, the packed weight 64"):
        getattr(mod, gemm)(_codes((2, 60), 0), vnni_pack(w), 32)
    with pytest.raises(RuntimeError, match="does not match"):
        getattr(mod, gemm)(_codes((2, 64), 0), vnni_pack(w), 48)
    with pytest.raises(RuntimeError, match="a must be a 2-D int8 CPU tensor"):
        getattr(mod, gemm)(torch.zeros(2, 64), vnni_pack(w), 32)


def test_avx2_backend_is_validated_and_auto_prefers_it_on_cpus_without_avx512():
    assert "avx2" in INT8_BACKENDS
    with pytest.raises(ValueError, match="int8_backend='avx2' cannot run here: it is a CPU kernel"):
        resolve_int8_backend("avx2", torch.device("cuda"))
    if not AVX2:
        with pytest.raises(ValueError, match="int8_backend='avx2' cannot run here"):
            resolve_int8_backend("avx2")
        return
    assert resolve_int8_backend("avx2") == "avx2"
    if not AVAILABLE and "AVX512" not in torch.backends.cpu.get_cpu_capability():
        assert resolve_int8_backend("auto") == "avx2"


@needs_avx2
def test_int8_accumulate_uses_the_avx2_kernel_at_every_row_count():
    """No row limit: prefill sizes too (level with fp32_exact there, without its fp32 copy of the codes)."""
    w = _codes((64, 40), 1)
    packed = vnni_pack(w)
    for m in (1, VNNI_MAX_M + 1):
        a = _codes((m, 60), m)  # K 60 < Kp 64: zero-padded like the other backends
        ref = torch.nn.functional.pad(a, (0, 4)).long() @ w.long()
        assert torch.equal(int8_accumulate(a, w, vnni=packed, backend="avx2").long(), ref)
    # the avx2 kernel, not _int_mm: a wrong packed layout shows in the values
    a = _codes((VNNI_MAX_M + 1, 64), 3)
    assert not torch.equal(int8_accumulate(a, w, vnni=torch.zeros_like(packed), backend="avx2"),
                           int8_accumulate(a, w))


@needs_vnni
def test_int8_accumulate_uses_int_mm_above_the_row_limit_with_the_same_values():
    w = _codes((64, 40), 1)
    packed = vnni_pack(w)
    for m in (VNNI_MAX_M, VNNI_MAX_M + 1):
        a = _codes((m, 60), m)  # K 60 < Kp 64: zero-padded like the other backends
        ref = torch.nn.functional.pad(a, (0, 4)).long() @ w.long()
        assert torch.equal(int8_accumulate(a, w, vnni=packed).long(), ref)


@pytest.mark.parametrize("backend, k", PACKED)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_backend_modules_equal_int_mm_modules_bit_for_bit(backend, k, dtype):
    qcfg = QuantConfig()
    lin = _linear(k, 30, True, 0).to(dtype)
    a, b = QuantLinear(lin, qcfg, int8_backend=backend), QuantLinear(lin, qcfg, int8_backend="int_mm")
    assert a.weight_vnni is not None and b.weight_vnni is None and "weight_vnni" not in a.state_dict()
    lins = {f"blk.{n}": _linear(k, s, False, i).to(dtype) for i, (n, s) in enumerate((("q_proj", 20), ("k_proj", 12)))}
    amaxes = {n: None for n in lins}
    fa, fb = FusedQuantLinear(lins, qcfg, amaxes, backend), FusedQuantLinear(lins, qcfg, amaxes, "int_mm")
    for rows in (1, 16, VNNI_MAX_M + 3):  # the last one through _int_mm for vnni, AMX tiles for amx
        x = torch.randn(rows, k).to(dtype)
        assert torch.equal(a(x), b(x))
        for u, v in zip(fa(x), fb(x)):
            assert torch.equal(u, v)
    # a weight sync repacks
    new = _linear(k, 30, True, 5).to(dtype)
    a.requantize(new.weight, new.bias)
    b.requantize(new.weight, new.bias)
    x = torch.randn(3, k).to(dtype)
    assert torch.equal(a(x), b(x))


@pytest.mark.parametrize("backend, k", PACKED)
@pytest.mark.parametrize("kind", ["llama", "qwen3_moe"])
def test_packed_backend_executor_equals_int_mm_executor_and_follows_a_sync(backend, k, kind):
    """The tiny models' q|k|v and gate|up have K = 64 (amx: AMX tiles), down K = 96 and the experts' down K = 32
    (amx: its vnni path); 40 tokens: prefill rows past the vnni kernel's tile sizes."""
    learner = tiny_causal_lm(kind, dtype=torch.bfloat16)
    ids = torch.randint(0, 128, (3, 40))
    ea = make_executor(learner, QuantConfig(), int8_backend=backend)
    eb = make_executor(learner, QuantConfig(), int8_backend="int_mm")
    if kind == "qwen3_moe":
        assert any(isinstance(m, QuantExperts) and m.gate_up_proj_vnni is not None for m in ea.modules())
    with torch.no_grad():
        assert torch.equal(ea(input_ids=ids).logits, eb(input_ids=ids).logits)
        perturb_and_sync(learner, ea, eb)
        la, lb = ea(input_ids=ids).logits, eb(input_ids=ids).logits
    assert torch.equal(la, lb)
    assert torch.equal(la, make_executor(learner, QuantConfig(), int8_backend="int_mm")(input_ids=ids).logits)


@needs_vnni
def test_vnni_modules_fall_back_to_int_mm_while_the_kernels_are_turned_off():
    lin = _linear(64, 40, False, 3)
    a, b = QuantLinear(lin, QuantConfig(), int8_backend="vnni"), QuantLinear(lin, QuantConfig(), int8_backend="int_mm")
    x = torch.randn(5, 64)
    kernels.set_enabled(False)
    try:
        assert torch.equal(a(x), b(x))
    finally:
        kernels.set_enabled(True)


def test_the_fallback_build_without_openmp_differs_only_there():
    """Where -fopenmp cannot be compiled or linked, kernels.load builds again without it (another name)."""
    assert "-fopenmp" in kernels._flags(True)
    assert kernels._flags(False) == [f for f in kernels._flags(True) if f != "-fopenmp"]
    assert kernels.build_name(True) != kernels.build_name(False)
    if kernels.get() is not None:
        assert kernels.status()["name"] == kernels.build_name(True)  # this machine links OpenMP
