"""The ``amx`` int8 backend (interq.quant.kernels' AMX-INT8 tile GEMM, every row count): the exact int32 accumulator
of torch._int_mm for every shape, extreme codes and thread count, from the same packed weights as the ``vnni``
backend, and executors bit-identical to the int_mm backend's, before and after a weight sync. Skipped on CPUs
without AMX-INT8 (the backend is not offered there; ``auto`` does not choose it)."""

import pytest
import torch

from interq.quant import QuantConfig, kernels, make_executor, sync_weights
from interq.quant.linear import (INT8_BACKENDS, FusedQuantLinear, QuantExperts, QuantLinear, amx_available,
                                 int8_accumulate, resolve_int8_backend, vnni_available, vnni_pack)
from interq.quant.testing import tiny_causal_lm

AVAILABLE, WHY = amx_available()
needs_amx = pytest.mark.skipif(not AVAILABLE, reason=f"amx backend: {WHY}")


def _codes(shape, seed):
    g = torch.Generator().manual_seed(seed)
    t = torch.randint(-128, 128, shape, generator=g, dtype=torch.int8)
    if t.numel() > 4:
        t.view(-1)[:3] = torch.tensor([-128, 127, -128], dtype=torch.int8)
    return t


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
        assert torch.equal(int8_accumulate(a, w, vnni=vnni_pack(w), amx=True).long(), ref)


def _linear(k, n, bias, seed):
    g = torch.Generator().manual_seed(seed)
    lin = torch.nn.Linear(k, n, bias=bias)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(n, k, generator=g) * 0.05)
        if bias:
            lin.bias.copy_(torch.randn(n, generator=g) * 0.1)
    return lin


@needs_amx
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_amx_modules_equal_int_mm_modules_bit_for_bit(dtype):
    qcfg = QuantConfig()
    lin = _linear(128, 30, True, 0).to(dtype)
    a, b = QuantLinear(lin, qcfg, int8_backend="amx"), QuantLinear(lin, qcfg, int8_backend="int_mm")
    assert a.weight_vnni is not None and b.weight_vnni is None and "weight_vnni" not in a.state_dict()
    lins = {f"blk.{n}": _linear(128, s, False, i).to(dtype) for i, (n, s) in enumerate((("q_proj", 20), ("k_proj", 12)))}
    amaxes = {n: None for n in lins}
    fa, fb = FusedQuantLinear(lins, qcfg, amaxes, "amx"), FusedQuantLinear(lins, qcfg, amaxes, "int_mm")
    for rows in (1, 16, 300):
        x = torch.randn(rows, 128).to(dtype)
        assert torch.equal(a(x), b(x))
        for u, v in zip(fa(x), fb(x)):
            assert torch.equal(u, v)
    new = _linear(128, 30, True, 5).to(dtype)  # a weight sync repacks
    a.requantize(new.weight, new.bias)
    b.requantize(new.weight, new.bias)
    x = torch.randn(3, 128).to(dtype)
    assert torch.equal(a(x), b(x))


@needs_amx
@pytest.mark.parametrize("kind", ["llama", "qwen3_moe"])
def test_amx_executor_equals_int_mm_executor_and_follows_a_sync(kind):
    learner = tiny_causal_lm(kind, dtype=torch.bfloat16)
    ids = torch.randint(0, 128, (3, 40))
    ea = make_executor(learner, QuantConfig(), int8_backend="amx")
    eb = make_executor(learner, QuantConfig(), int8_backend="int_mm")
    if kind == "qwen3_moe":
        assert any(isinstance(m, QuantExperts) and m.gate_up_proj_vnni is not None for m in ea.modules())
    with torch.no_grad():
        assert torch.equal(ea(input_ids=ids).logits, eb(input_ids=ids).logits)
        for p in learner.parameters():
            p.mul_(1.2).add_(0.01 * torch.randn_like(p))
        sync_weights(learner, ea)
        sync_weights(learner, eb)
        la, lb = ea(input_ids=ids).logits, eb(input_ids=ids).logits
    assert torch.equal(la, lb)
