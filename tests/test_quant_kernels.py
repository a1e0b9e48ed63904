"""The fused CPU kernels (interq.kernels) give the eager primitives' values bit for bit, and the executor
built with them gives the same logits as with the eager ops."""

import shutil

import pytest
import torch

from interq import kernels
from interq.quant import primitives as P
from interq.quant.config import QuantConfig, int_qmax
from interq.quant.linear import epilogue_fp32
from interq.quant.testing import tiny_causal_lm

pytestmark = pytest.mark.skipif(shutil.which("c++") is None and shutil.which("g++") is None,
                                reason="no C++ compiler: the executor keeps its eager ops")  # ninja: a dependency


@pytest.fixture(scope="module")
def mod():
    if not kernels.status()["enabled"]:
        pytest.skip("the kernels are turned off (INTERQ_CPU_KERNELS=0)")
    m = kernels.load()
    assert m is not None, kernels.status()  # a compiler is there: the build must work
    return m


def _awkward(shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g) * torch.logspace(-3, 3, shape[-1])[torch.randperm(shape[-1], generator=g)]
    x[0] = 0.0  # a zero row: scale 0, codes 0
    if shape[0] > 2:
        x[1, :3] = torch.tensor([2.5, -2.5, 0.5]) * x[1].abs().max() / 127  # exact ties after scaling
        x[2] = 1e-30  # subnormal-ish scales
    return x.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bits", [8, 6, 4, 3, 2])
def test_activation_quantizer_equals_the_primitive(mod, dtype, bits):
    for shape in [(16, 576), (5, 7), (1, 1536), (33, 64)]:
        x = _awkward(shape, dtype, seed=shape[1])
        q, s = mod.quant_act_int8(x, int_qmax(bits))
        q0, s0 = P.quant_act_int8_token(x, "half_even", bits)
        assert torch.equal(q, q0) and torch.equal(s, s0)
    wide = _awkward((8, 96), dtype)[:, :64]  # rows strided, columns contiguous (a view)
    q, s = mod.quant_act_int8(wide, 127)
    q0, s0 = P.quant_act_int8_token(wide, "half_even", 8)
    assert torch.equal(q, q0) and torch.equal(s, s0)
    odd = _awkward((5, 100), dtype, seed=7)  # 32-wide, 8-wide and scalar parts of a row; NaN and inf rows
    odd[2, 5], odd[3, 70], odd[4, 99] = float("nan"), float("inf"), float("-inf")
    q, s = mod.quant_act_int8(odd, 127)
    q0, s0 = P.quant_act_int8_token(odd, "half_even", 8)
    assert torch.equal(q, q0) and torch.equal(s.nan_to_num(-1.0), s0.nan_to_num(-1.0))


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_epilogue_equals_the_eager_one_per_member(mod, out_dtype):
    g = torch.Generator().manual_seed(1)
    acc = torch.randint(-2**30, 2**30, (16, 968), generator=g, dtype=torch.int32)  # beyond 2^24: RNE to fp32
    acc[:, :5] = torch.tensor([0, 1, -1, 2**24 + 1, -(2**31)])
    s_a = torch.rand(16, 1, generator=g) * 1e-3
    s_a[3] = 0.0
    s_w = torch.rand(968, generator=g) * 1e-3
    sizes = [576, 192, 192]  # q|k|v of SmolLM2, the accumulator padded to 968 columns
    outs = mod.epilogue(acc, s_a, s_w, sizes, out_dtype)
    ref = epilogue_fp32(acc[:, :960], s_a, s_w[:960], None, out_dtype).to(out_dtype)
    start = 0
    for n, o in zip(sizes, outs):
        assert o.is_contiguous() and o.dtype == out_dtype
        assert torch.equal(o.view(-1).view(torch.int16 if o.element_size() == 2 else torch.int32),
                           ref[:, start:start + n].contiguous().view(-1).view(torch.int16 if o.element_size() == 2 else torch.int32))
        start += n
    # a per-tensor weight scale ([] or [1], as QuantLinear keeps it), one member
    for sw in (torch.tensor(3e-4), torch.tensor([3e-4])):
        (o,) = mod.epilogue(acc, s_a, sw, [968], out_dtype)
        assert torch.equal(o, epilogue_fp32(acc, s_a, sw, None, out_dtype).to(out_dtype))
    # NaN and inf scales follow the eager conversion (NaN -> bf16 0x7FC0)
    s_a[5] = float("nan")
    s_a[6] = float("inf")
    (o,) = mod.epilogue(acc, s_a, s_w, [968], out_dtype)
    ref = epilogue_fp32(acc, s_a, s_w, None, out_dtype).to(out_dtype)
    assert torch.equal(o[~torch.isnan(ref)], ref[~torch.isnan(ref)]) and torch.isnan(o).equal(torch.isnan(ref))


def test_bad_inputs_are_refused_with_the_argument_named(mod):
    with pytest.raises(RuntimeError, match="quant_act_int8"):
        mod.quant_act_int8(torch.zeros(4, 4, dtype=torch.float64), 127)
    with pytest.raises(RuntimeError, match="sizes exceed"):
        mod.epilogue(torch.zeros(2, 8, dtype=torch.int32), torch.ones(2, 1), torch.ones(8), [8, 8], torch.float32)


def test_the_executor_gives_the_same_logits_with_and_without_the_kernels(mod):
    from interq.quant import make_executor, make_kv_cache


    for qcfg in (QuantConfig(), QuantConfig(w_bits=4, a_bits=4, kv_bits=4)):
        for dtype in (torch.float32, torch.bfloat16):
            model = tiny_causal_lm("qwen3", dtype=dtype)
            ids = torch.randint(0, model.config.vocab_size, (3, 9), generator=torch.Generator().manual_seed(0))
            logits = {}
            for on in (False, True):
                kernels.set_enabled(on)
                try:
                    ex = make_executor(model, qcfg)
                    cache = make_kv_cache(qcfg, ex.config)
                    with torch.no_grad():
                        out = ex(input_ids=ids[:, :6], cache=cache, use_cache=True)
                        steps = [out.logits]
                        for t in range(6, 9):
                            out = ex(input_ids=ids[:, t:t + 1], cache=out.cache, use_cache=True)
                            steps.append(out.logits)
                    logits[on] = torch.cat(steps, 1)
                finally:
                    kernels.set_enabled(True)
            assert torch.equal(logits[False], logits[True]), (qcfg, dtype)


def test_prune_removes_only_old_unused_builds(tmp_path, monkeypatch):
    """Builds not loaded for PRUNE_AFTER_DAYS go; the one in use, recent ones, one being built and other files stay."""
    import os
    import time

    monkeypatch.setenv("INTERQ_KERNELS_DIR", str(tmp_path))
    old = time.time() - 40 * 86400
    for name, age, lock in (("interq_int8_kernels_old", old, False), ("interq_int8_kernels_building", old, True),
                            ("interq_int8_kernels_recent", time.time(), False), ("interq_int8_kernels_keep", old, False)):
        d = tmp_path / name
        d.mkdir()
        (d / "x.so").write_bytes(b"")
        if lock:
            (d / "lock").write_bytes(b"")
        os.utime(d, (age, age))
    used = tmp_path / "interq_int8_kernels_old_but_used"
    used.mkdir()
    os.utime(used, (old, old))
    (used / "last_used").touch()  # loaded just now by some process
    (tmp_path / "notes.txt").write_text("not a build")
    assert kernels.prune("interq_int8_kernels_keep") == ["interq_int8_kernels_old"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "interq_int8_kernels_building", "interq_int8_kernels_keep", "interq_int8_kernels_old_but_used",
        "interq_int8_kernels_recent", "notes.txt"]
