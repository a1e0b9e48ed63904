"""The ``amx`` int8 backend (interq.kernels' AMX-INT8 tile GEMM, every row count): the exact int32 accumulator
of torch._int_mm for every shape, extreme codes and thread count, from the same packed weights as the ``vnni``
backend (its modules and executors against the int_mm backend's, before and after a weight sync: with the vnni
backend's in tests/test_quant_vnni.py). Skipped on CPUs without AMX-INT8 (the backend is not offered there; ``auto``
does not choose it)."""

import pytest
import torch

from interq import kernels
from interq.quant.linear import (INT8_BACKENDS, amx_available, avx2_available, int8_accumulate, resolve_int8_backend,
                                 vnni_available, vnni_pack)
from interq.quant.testing import random_codes as _codes

AVAILABLE, WHY = amx_available()
needs_amx = pytest.mark.skipif(not AVAILABLE, reason=f"amx backend: {WHY}")
AVX2, WHY_AVX2 = avx2_available()
# the backends whose whole W8A8 linear is one kernel call (whole_linear): amx's int8_linear_amx, avx2's int8_linear_avx2
WHOLE = [pytest.param("amx", marks=needs_amx),
         pytest.param("avx2", marks=pytest.mark.skipif(not AVX2, reason=f"avx2 backend: {WHY_AVX2}"))]


def test_amx_backend_is_validated_and_auto_prefers_it_where_available():
    assert "amx" in INT8_BACKENDS
    if AVAILABLE:
        assert resolve_int8_backend("auto") == "amx" and resolve_int8_backend("amx") == "amx"
    else:
        with pytest.raises(ValueError, match="int8_backend='amx' cannot run here"):
            resolve_int8_backend("amx")
        assert resolve_int8_backend("auto") != "amx"
    with pytest.raises(ValueError, match="int8_backend='amx' cannot run here: it is a CPU kernel"):
        resolve_int8_backend("amx", torch.device("cuda"))
    if kernels.get() is not None and not vnni_available()[0]:
        assert not kernels.get().has_int8_gemm_amx()  # AMX builds are VNNI builds


@needs_amx
@pytest.mark.parametrize("m", [1, 5, 16, 17, 32, 33, 70])
@pytest.mark.parametrize("k,n", [(576, 960), (64, 1), (64, 17), (1536, 576), (128, 48), (4096, 33)])
@pytest.mark.parametrize("threads", [1, 2])
def test_amx_gemm_equals_int_mm_exactly(m, k, n, threads):
    """Row blocks of 1-16 rows (one tile), 17-32 (two), a partial last block; column tails of 1-15 and 17 (a block
    stored through the scratch tile), one- and two-block panels, K from one tile's depth to 64 of them (panel
    groups kept in L2 of several sizes), the extreme codes (-128 * -128, where the unsigned offset matters)."""
    a, w = _codes((m, k), seed=m * 1000 + k), _codes((k, n), seed=n)
    ref = a.long() @ w.long()
    mod = kernels.get()
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = mod.int8_gemm_amx(a, vnni_pack(w), n)
    finally:
        torch.set_num_threads(before)
    assert got.dtype == torch.int32 and got.shape == (m, n)
    assert torch.equal(got.long(), ref)


@needs_amx
def test_amx_gemm_at_prefill_size_and_the_worst_case_accumulator():
    a, w = _codes((700, 576), 1), _codes((576, 2000), 2)  # many row blocks over several panel groups
    assert torch.equal(kernels.get().int8_gemm_amx(a, vnni_pack(w), 2000).long(), a.long() @ w.long())
    k = 4096  # all products -128 * -128 (and -128 * 127): 2^26 in magnitude, plus the 128 * rowsum offset
    a = torch.full((3, k), -128, dtype=torch.int8)
    w = torch.full((k, 20), -128, dtype=torch.int8)
    w[:, 1] = 127
    assert torch.equal(kernels.get().int8_gemm_amx(a, vnni_pack(w), 20).long(), a.long() @ w.long())


@needs_amx
def test_amx_kernel_refuses_bad_inputs_with_the_argument_named():
    mod = kernels.get()
    w = _codes((64, 32), 0)
    with pytest.raises(RuntimeError, match="K must be a multiple of 64, got 96"):
        mod.int8_gemm_amx(_codes((2, 96), 0), vnni_pack(_codes((96, 32), 0)), 32)
    with pytest.raises(RuntimeError, match="a has K = 128, the packed weight 64"):
        mod.int8_gemm_amx(_codes((2, 128), 0), vnni_pack(w), 32)
    with pytest.raises(RuntimeError, match="does not match"):
        mod.int8_gemm_amx(_codes((2, 64), 0), vnni_pack(w), 48)
    with pytest.raises(RuntimeError, match="a must be a 2-D int8 CPU tensor"):
        mod.int8_gemm_amx(torch.zeros(2, 64), vnni_pack(w), 32)


@needs_amx
@pytest.mark.parametrize("k", [60, 64, 200])
def test_int8_accumulate_takes_amx_where_k_allows_and_the_vnni_path_elsewhere(k):
    """Kp = 64 (K 60 zero-padded) runs on AMX; Kp = 200 is no multiple of 64: the vnni kernel / _int_mm, same values."""
    kp = (k + 7) // 8 * 8
    w = _codes((kp, 40), 1)
    for m in (3, 300):
        a = _codes((m, k), m)
        ref = torch.nn.functional.pad(a, (0, kp - k)).long() @ w.long()
        assert torch.equal(int8_accumulate(a, w, vnni=vnni_pack(w), backend="amx").long(), ref)


@pytest.mark.parametrize("backend", WHOLE)
@pytest.mark.parametrize("m", [1, 5, 16, 17, 33, 100, 300])
@pytest.mark.parametrize("k,kp,sizes", [(576, 576, (576, 192, 192)), (1536, 1536, (576,)), (100, 128, (40, 24)),
                                        (64, 64, (16, 3))])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16])
@pytest.mark.parametrize("scalar_scale", [False, True])
def test_whole_linear_equals_quantize_accumulate_epilogue_called_in_turn(backend, m, k, kp, sizes, dtype,
                                                                         scalar_scale):
    from interq.quant.linear import epilogue_split, quant_act_int8, whole_linear

    g = torch.Generator().manual_seed(m + k)
    x = (torch.randn(m, k, generator=g) * torch.exp(torch.randn(m, k, generator=g))).to(dtype)
    if m > 3:
        x[2] = 0  # a zero row: scale 0
        x[3, 1] = float("nan")  # a NaN row: NaN outputs (0x7FC0 in bf16, as the epilogue kernel writes them)
        x[1, 0] = float("inf")
    n = sum(sizes)
    w = _codes((kp, -(-n // 16) * 16), k)
    s_w = torch.tensor(0.013) if scalar_scale else torch.rand(w.shape[1], generator=g) * 0.01
    q, s_a = quant_act_int8(x, "half_even", 8)
    ref = epilogue_split(int8_accumulate(q, w, vnni=vnni_pack(w), backend=backend), s_a, s_w, None, sizes, dtype)
    got = whole_linear(x, w, vnni_pack(w), s_w, sizes, None, "half_even", 8, dtype, backend)
    assert got is not None and len(got) == len(sizes)
    for a, b, size in zip(got, ref, sizes):
        assert a.shape == (m, size) and a.is_contiguous()
        assert torch.equal(a.view(torch.int16) if dtype != torch.float32 else a.view(torch.int32),
                           b.view(torch.int16) if dtype != torch.float32 else b.view(torch.int32))  # bits, NaNs too


@pytest.mark.parametrize("backend", WHOLE)
def test_whole_linear_declines_what_it_does_not_compute(backend):
    from interq.quant.linear import whole_linear

    x, w = torch.randn(4, 64), _codes((64, 16), 0)
    s = torch.ones(16)
    assert whole_linear(x, w, vnni_pack(w), s, (16,), torch.zeros(16), "half_even", 8, torch.float32, backend) is None
    assert whole_linear(x, w, vnni_pack(w), s, (16,), None, "half_away", 8, torch.float32, backend) is None
    assert whole_linear(x, w, vnni_pack(w), s, (16,), None, "half_even", 8, torch.float32, "int_mm") is None
    assert whole_linear(x, w, None, s, (16,), None, "half_even", 8, torch.float32, backend) is None
    if backend == "amx":
        assert whole_linear(x, _codes((72, 16), 0), vnni_pack(_codes((72, 16), 0)), s, (16,), None, "half_even", 8,
                            torch.float32, backend) is None  # Kp not a multiple of 64
