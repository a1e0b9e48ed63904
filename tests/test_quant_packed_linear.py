"""PackedBf16Linear (interq.kernels.packed_linear): the executors' bf16 linears with their weights packed once for
oneDNN or for interq's AMX-BF16 kernel, or for interq's AVX2 product on CPUs without native bf16, give F.linear's bits
at every row count they take, follow weight writes, keep ties and parameter names, survive deepcopy, and leave the
executors' outputs unchanged. Skipped where packing is not offered (a CPU without native bf16 where interq's kernels
do not build)."""

import copy

import pytest
import torch
from torch import nn

from interq.quant import BF16_EXECUTOR, QuantConfig, make_executor
from interq import kernels
from interq.kernels import packed_linear
from interq.kernels.packed_linear import PACKED_MAX_M, PackedBf16Linear, pack_bf16_linears, packing_available
from interq.quant.testing import perturb_and_sync, seeded_linear, tiny_causal_lm

AVAILABLE, WHY = packing_available()
needs_packing = pytest.mark.skipif(not AVAILABLE, reason=f"bf16 packing: {WHY}")


def _linear(k, n, bias, seed, dtype=torch.bfloat16):
    return seeded_linear(k, n, bias, seed, dtype).requires_grad_(False)  # as in an executor (packing needs no grad)


@pytest.mark.slow
@needs_packing
@pytest.mark.parametrize("k,n", [(64, 64), (96, 40), (16, 3), (576, 192), (576, 960), (1536, 576), (576, 8192)])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("threads", [1, 2])
def test_packed_product_equals_f_linear_bit_for_bit_at_every_row_count(k, n, bias, threads):
    lin = _linear(k, n, bias, k + n)
    mod = PackedBf16Linear.from_linear(lin)
    assert mod is not None
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        g = torch.Generator().manual_seed(1)
        # 96 rows of 576 x 192 at 2 threads: oneDNN's F.linear split the work otherwise than the packed product on the
        # Xeon with AMX (results/benchmarks/xeon-amx/2026-12-03-packed-bf16-multiturn/packed_rows_grid.log); the first call of a case compares
        for m in (1, 2, 3, 7, 15, 16, 17, 31, 33, 48, 64, 96, 100, 128, 200, PACKED_MAX_M, PACKED_MAX_M + 1):
            x = torch.randn(m, k, generator=g).to(torch.bfloat16)
            assert torch.equal(mod(x), nn.functional.linear(x, lin.weight, lin.bias)), m
    finally:
        torch.set_num_threads(before)


@needs_packing
def test_each_case_takes_the_product_its_choice_names(monkeypatch):
    lin = _linear(64, 40, True, 3)
    mod = PackedBf16Linear.from_linear(lin)
    calls = []
    for name in ("_packed_product", "_amx_product", "_avx2_product"):
        real = getattr(packed_linear, name)
        monkeypatch.setattr(packed_linear, name, lambda *a, _n=name, _r=real: calls.append((_n, a[0].shape[0])) or _r(*a))
    key = packed_linear._choice_key(64, 40, True, 5)
    x = torch.randn(5, 64).to(torch.bfloat16)
    ref = nn.functional.linear(x, lin.weight, lin.bias)
    monkeypatch.setitem(packed_linear._CHOICES, key, ("linear", 0))  # as where neither product gives its bits
    assert torch.equal(mod(x), ref) and calls == []
    if packed_linear._native_bf16():
        monkeypatch.setitem(packed_linear._CHOICES, key, ("onednn", 0))
        assert torch.equal(mod(x), ref) and calls == [("_packed_product", 5)]
    if packed_linear._avx2_on():
        monkeypatch.setitem(packed_linear._CHOICES, key, ("avx2", 0))
        assert torch.equal(mod(x), ref) and calls == [("_avx2_product", 5)]
    if packed_linear._amx_on():
        calls.clear()
        monkeypatch.setitem(packed_linear._CHOICES, key, ("amx", 0))
        assert torch.equal(mod(x), ref) and calls == [("_amx_product", 5)]
    monkeypatch.delitem(packed_linear._CHOICES, key)  # a first call: compared on the probe, then remembered
    calls.clear()
    assert torch.equal(mod(x), ref)
    product, _ = packed_linear._CHOICES[key]
    assert calls[-1] == ((f"_{product}_product" if product in ("amx", "avx2") else "_packed_product"), 5) or product == "linear"


AMX, AMX_WHY = packed_linear.amx_available() if AVAILABLE else (False, WHY)
needs_amx = pytest.mark.skipif(not AMX, reason=f"AMX-BF16 product: {AMX_WHY}")


@needs_amx
@pytest.mark.parametrize("k,n,bias", [(64, 40, True), (576, 192, False), (1536, 576, False), (96, 33, True)])
@pytest.mark.parametrize("kb", [0, 1, 2])
def test_amx_product_is_a_blocked_fp32_sum_rounded_once(k, n, bias, kb):
    # the kernel's definition, in float64 where every partial sum of these small integers is exact: K blocks of kb
    # chunks of 32 summed apart and added in order, the bias last, one rounding to bf16
    g = torch.Generator().manual_seed(k + n + kb)
    x = torch.randint(-8, 9, (37, k), generator=g).to(torch.bfloat16)
    w = torch.randint(-8, 9, (n, k), generator=g).to(torch.bfloat16)
    b = torch.randint(-50, 51, (n,), generator=g).to(torch.bfloat16) if bias else None
    got = packed_linear._amx_product(x, packed_linear.pack_bf16_amx(w), n, b, kb)
    want = x.double() @ w.double().T + (b.double() if bias else 0)
    assert got.dtype == torch.bfloat16 and got.shape == (37, n)
    assert torch.equal(got, want.to(torch.bfloat16))


@needs_amx
def test_amx_product_blocks_change_the_sums_and_the_probe_tells_them_apart():
    # on the probe, K blocks of 2 chunks and none give other outputs: a wrong blocking could not pass for F.linear's
    x, w, b = packed_linear._probe(16, 576, 64, False)
    packed = packed_linear.pack_bf16_amx(w)
    whole, blocked = (packed_linear._amx_product(x, packed, 64, b, kb) for kb in (0, 2))
    assert (whole != blocked).float().mean() > 0.2


def _special_values(k: int = 64, n: int = 48) -> tuple[torch.Tensor, torch.Tensor]:
    """x [6, k], w [n, k] bf16 with an inf, a NaN, products below fp32's normal range, a zero weight row and a row
    that overflows to inf."""
    x = torch.randn(6, k).to(torch.bfloat16)
    w = (torch.randn(n, k) * 0.1).to(torch.bfloat16)
    x[1, 3] = float("inf")
    x[2, 5] = float("nan")
    x[3] *= 1e-38  # products below fp32's normal range
    w[7] = 0
    x[4, :] = 3e38  # overflow to inf
    return x, w


@needs_amx
def test_amx_product_rounds_and_propagates_special_values_as_f_linear():
    n = 48
    x, w = _special_values(n=n)
    got = packed_linear._amx_product(x, packed_linear.pack_bf16_amx(w), n, None, 0)
    ref = nn.functional.linear(x, w)
    assert torch.equal(got.view(torch.int16), ref.view(torch.int16))  # bits, NaNs included (vcvtneps2bf16 both)


@needs_amx
def test_amx_off_the_cases_take_the_earlier_products():
    lin = _linear(576, 192, False, 9)
    mod = PackedBf16Linear.from_linear(lin)
    x = torch.randn(16, 576).to(torch.bfloat16)
    try:
        packed_linear.use_amx_product(False)
        assert packed_linear.product_choice(576, 192, False, 16)[0] != "amx"
        off = mod(x)
        packed_linear.use_amx_product(True)
        assert torch.equal(mod(x), off)  # whichever product this machine's oneDNN lets the case take
    finally:
        packed_linear.use_amx_product(True)


def _reference_dot(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """torch's reference bf16 GEMM (CPUs without native bf16), written out in fp32 tensor ops: per output, 8 x 8
    running sums over blocks of 64 k (slot k % 64), added r + r + 4, + 2, + 1 then lanes l + l + 4, + 2, + 1; the
    16-k chunks after the blocks into 8 more running sums (slot (k - start) % 8), added by the same lane tree; then
    the last k % 16 products one by one; bias + sum, rounded to bf16. Products of bf16 values are exact in fp32."""
    xf, wf = x.float(), w.float()
    m, k = xf.shape
    n = wf.shape[0]

    def lane_tree(v):  # [..., 8]
        v = v[..., :4] + v[..., 4:]
        v = v[..., :2] + v[..., 2:]
        return v[..., 0] + v[..., 1]

    main, vec = k // 64 * 64, k // 64 * 64 + (k % 64) // 16 * 16
    slots = torch.zeros(m, n, 64)
    for j in range(0, main, 64):
        slots = slots + xf[:, None, j:j + 64] * wf[None, :, j:j + 64]
    regs = slots.view(m, n, 8, 8)
    regs = regs[:, :, :4] + regs[:, :, 4:]
    regs = regs[:, :, :2] + regs[:, :, 2:]
    total = lane_tree(regs[:, :, 0] + regs[:, :, 1])
    tail = torch.zeros(m, n, 8)
    for j in range(main, vec, 8):
        tail = tail + xf[:, None, j:j + 8] * wf[None, :, j:j + 8]
    total = total + lane_tree(tail)
    for j in range(vec, k):
        total = total + xf[:, None, j] * wf[None, :, j]
    return (total if b is None else b.float() + total).to(torch.bfloat16)


AVX2_KERNEL = kernels.load() is not None and kernels.load().has_bf16_linear_avx2()
needs_avx2_kernel = pytest.mark.skipif(not AVX2_KERNEL, reason="interq's kernels without AVX2 and FMA here")


@needs_avx2_kernel
@pytest.mark.parametrize("k", [1, 7, 16, 31, 64, 72, 100, 200, 576, 1536])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("threads", [1, 2])
def test_avx2_product_is_torchs_reference_kernel_sum_order(k, bias, threads):
    """The kernel on any AVX2 CPU against its definition (_reference_dot) on the probe: K with and without 64-k
    blocks, 16-k chunks and a last k % 16; 1-13 rows (every tile of 1-6 rows), column tails."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for m, n in ((1, 16), (5, 33), (13, 40)):
            x, w, b = packed_linear._probe(m, k, n, bias)
            got = kernels.get().bf16_linear_avx2(x, packed_linear.pack_bf16_avx2(w), n, b)
            assert got.dtype == torch.bfloat16 and got.shape == (m, n)
            assert torch.equal(got.view(torch.int16), _reference_dot(x, w, b).view(torch.int16)), (m, n)
    finally:
        torch.set_num_threads(before)


NATIVE_BF16 = packed_linear._native_bf16()


@pytest.mark.skipif(NATIVE_BF16 or not AVX2_KERNEL, reason="torch's bf16 GEMMs are oneDNN's here (native bf16), or "
                    "interq's kernels lack AVX2 and FMA")
def test_avx2_product_is_f_linear_where_torch_runs_its_reference_kernel():
    """The definition above is F.linear's on this CPU, and the modules take the AVX2 product, prefill rows too."""
    for m, k, n, bias in ((3, 576, 64, False), (16, 100, 40, True), (2, 31, 20, False)):
        x, w, b = packed_linear._probe(m, k, n, bias)
        assert torch.equal(_reference_dot(x, w, b).view(torch.int16), nn.functional.linear(x, w, b).view(torch.int16))
    lin = _linear(576, 192, True, 4)
    mod = PackedBf16Linear.from_linear(lin)
    for m in (1, 16, PACKED_MAX_M + 44):
        x = torch.randn(m, 576).to(torch.bfloat16)
        assert mod.product(x)[0] == "avx2"
        assert torch.equal(mod(x), nn.functional.linear(x, lin.weight, lin.bias))
    try:
        packed_linear.use_avx2_product(False)
        assert mod.product(torch.randn(16, 576).to(torch.bfloat16))[0] == "linear"
    finally:
        packed_linear.use_avx2_product(True)
    # every prefill length shares one probe: one for one row, one for more, at any thread count
    assert packed_linear._choice_key(576, 192, True, 300) == packed_linear._choice_key(576, 192, True, 2)
    assert packed_linear._choice_key(576, 192, True, 1) != packed_linear._choice_key(576, 192, True, 2)


@pytest.mark.skipif(NATIVE_BF16 or not AVX2_KERNEL, reason="no AVX2 product here")
def test_a_first_ask_while_the_kernels_are_off_does_not_keep_the_avx2_product_off(monkeypatch):
    monkeypatch.setitem(packed_linear._AVX2, "here", None)  # not asked yet in this process
    mod = PackedBf16Linear.from_linear(_linear(64, 40, False, 2))
    x = torch.randn(4, 64).to(torch.bfloat16)
    kernels.set_enabled(False)
    try:
        assert mod.product(x)[0] == "linear"
    finally:
        kernels.set_enabled(True)
    assert mod.product(x)[0] == "avx2"


@needs_avx2_kernel
def test_avx2_product_propagates_special_values_as_torchs_reference_kernel():
    n = 48
    x, w = _special_values(n=n)
    got = kernels.get().bf16_linear_avx2(x, packed_linear.pack_bf16_avx2(w), n, None)
    want = _reference_dot(x, w, None)
    assert torch.equal(got.isnan(), want.isnan())
    assert torch.equal(got.nan_to_num(), want.nan_to_num())
    if not NATIVE_BF16:
        ref = nn.functional.linear(x, w)
        assert torch.equal(got.isnan(), ref.isnan()) and torch.equal(got.nan_to_num(), ref.nan_to_num())


def test_the_probe_shows_another_summation_order_in_most_bf16_outputs():
    # on random inputs two summation orders differ in one output in thousands; the probe's are rounded apart
    x, w, _ = packed_linear._probe(16, 96, 40, False)
    products = x.float()[:, None, :] * w.float()[None, :, :]  # [16, 40, 96], each exact in fp32

    def summed(order):
        acc = torch.zeros(16, 40)
        for j in order:
            acc += products[..., j]
        return acc.to(torch.bfloat16)

    forward, backward = summed(range(96)), summed(reversed(range(96)))
    assert (forward != backward).float().mean() > 0.5


@needs_packing
def test_packed_linear_takes_any_leading_shape_and_strided_inputs():
    lin = _linear(64, 48, True, 0)
    mod = PackedBf16Linear.from_linear(lin)
    x = torch.randn(4, 5, 64).to(torch.bfloat16)
    assert torch.equal(mod(x), nn.functional.linear(x, lin.weight, lin.bias))
    x = torch.randn(4, 6, 128).to(torch.bfloat16)[:, 1:, ::2]  # [4, 5, 64], strided: F.linear's own (other) path
    assert torch.equal(mod(x), nn.functional.linear(x, lin.weight, lin.bias))
    assert mod(x[:0]).shape == (0, 5, 48)


@needs_packing
def test_packed_linear_follows_writes_to_its_weight():
    lin = _linear(64, 32, False, 0)
    mod = PackedBf16Linear.from_linear(lin)
    x = torch.randn(5, 64).to(torch.bfloat16)
    y0 = mod(x)
    with torch.no_grad():
        lin.weight.mul_(-2.0)  # the same Parameter: a weight sync writes into it in place
    y1 = mod(x)
    assert torch.equal(y1, nn.functional.linear(x, lin.weight)) and not torch.equal(y0, y1)


@needs_packing
def test_packed_linear_leaves_autograd_and_other_dtypes_to_f_linear():
    lin = _linear(64, 32, True, 0).requires_grad_(True)
    mod = PackedBf16Linear.from_linear(lin)
    x = torch.randn(3, 64).to(torch.bfloat16).requires_grad_(True)
    mod(x).float().sum().backward()
    assert x.grad is not None and lin.weight.grad is not None
    assert PackedBf16Linear.from_linear(_linear(64, 32, False, 0, torch.float32)) is None


def test_packing_is_not_offered_off_the_cpu_and_says_why():
    ok, why = packing_available("cuda")
    assert not ok and "not a CPU device" in why
    if not AVAILABLE:
        assert PackedBf16Linear.from_linear(_linear(64, 32, False, 0)) is None


@needs_packing
@pytest.mark.parametrize("kind", ["llama", "qwen3_moe"])
@pytest.mark.parametrize("quantized", [False, True])
def test_executors_with_packed_linears_equal_unpacked_ones_and_follow_a_sync(kind, quantized):
    learner = tiny_causal_lm(kind, dtype=torch.bfloat16)
    qcfg = QuantConfig() if quantized else BF16_EXECUTOR
    ea, eb = make_executor(learner, qcfg), make_executor(learner, qcfg, pack_bf16=False)
    packed = [n for n, m in ea.named_modules() if isinstance(m, PackedBf16Linear)]
    assert "lm_head" in packed and (len(packed) == 1 if quantized else len(packed) > 1)
    assert not any(isinstance(m, PackedBf16Linear) for m in eb.modules())
    assert list(ea.state_dict()) == list(eb.state_dict())  # same names, no packed copy saved
    if learner.config.tie_word_embeddings:
        assert ea.lm_head.weight is ea.model.embed_tokens.weight
    ids = torch.randint(0, 128, (3, 9))
    with torch.no_grad():
        assert torch.equal(ea(input_ids=ids).logits, eb(input_ids=ids).logits)
        perturb_and_sync(learner, ea, eb)
        la = ea(input_ids=ids).logits
        assert torch.equal(la, eb(input_ids=ids).logits)
        assert torch.equal(copy.deepcopy(ea)(input_ids=ids).logits, la)


@needs_packing
def test_pack_bf16_linears_replaces_only_plain_bf16_linears():
    model = nn.Sequential(_linear(64, 32, False, 0), nn.ReLU(), _linear(32, 8, True, 1, torch.float32))
    assert pack_bf16_linears(model) == 1
    assert isinstance(model[0], PackedBf16Linear) and type(model[2]) is nn.Linear


@pytest.mark.parametrize("quantized", [False, True])
def test_an_executor_built_under_inference_mode_runs_and_equals_one_built_outside(quantized):
    # its tensors are inference tensors, which have no version counter: their linears stay F.linear's
    learner = tiny_causal_lm("llama", dtype=torch.bfloat16)
    qcfg = QuantConfig() if quantized else BF16_EXECUTOR
    ids = torch.randint(0, 128, (2, 7))
    with torch.inference_mode():
        inside = make_executor(learner, qcfg)
        logits = inside(input_ids=ids).logits
    assert not any(isinstance(m, PackedBf16Linear) for m in inside.modules())
    with torch.no_grad():
        assert torch.equal(logits, make_executor(learner, qcfg)(input_ids=ids).logits)


def test_a_new_weight_parameter_is_packed_again():
    """A new Parameter put in place of the weight (its version counter may equal the old one's) is packed again:
    the module's output is F.linear's with the new weight."""
    from interq.kernels.packed_linear import PackedBf16Linear

    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 48, bias=False).bfloat16().requires_grad_(False)
    mod = PackedBf16Linear.from_linear(lin)
    if mod is None:
        pytest.skip("no packed product on this CPU")
    x = torch.randn(4, 64).bfloat16()
    mod(x)
    mod.weight = torch.nn.Parameter(torch.randn(48, 64).bfloat16(), requires_grad=False)
    assert torch.equal(mod(x), torch.nn.functional.linear(x, mod.weight))
    with torch.no_grad():
        mod.weight.data = torch.randn(48, 64).bfloat16()  # new data under the same Parameter (as module.to does)
    assert torch.equal(mod(x), torch.nn.functional.linear(x, mod.weight))
