"""Quantization primitives against their closed forms (quant-spec.md "Formats"; quant_numerics.md 7.2)."""

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
