"""The aligned learner forward (docs/executor.md, "Alignment"): same quantize-dequantize as the executor,
straight-through gradients, and a residual that comes only from real differences."""

import pytest
import torch
from torch import nn

from interq.quant import QuantConfig, aligned, make_executor, make_kv_cache, quantized_targets
from interq.quant import primitives as P
from interq.quant.aligned import aligned_linear_forward
from interq.quant.linear import FusedQuantSlice, QuantExperts, QuantLinear
from interq.quant.testing import tiny_causal_lm


def _record_inputs(modules):
    seen, hooks = {}, []
    for name, mod in modules.items():
        def hook(m, args, name=name):
            seen.setdefault(name, []).append(args[0].detach().reshape(-1, args[0].shape[-1]))
        hooks.append(mod.register_forward_pre_hook(hook))
    return seen, hooks


@pytest.mark.parametrize("kind", ["llama", "qwen3", "qwen3_moe"])
def test_aligned_learner_matches_executor_prefill_up_to_int8_boundaries(kind, record_property):
    """fp32 model: the aligned learner (float matmul of dequantized operands) and the executor prefill
    (int32 accumulation + CUTLASS epilogue, quantized cache) agree to fp32 rounding, except where an
    activation lands on an int8 rounding boundary and its code flips. We measure the share of flipped codes."""
    qcfg = QuantConfig()
    learner = tiny_causal_lm(kind, num_layers=3)
    exe = make_executor(learner, qcfg)
    ids = torch.randint(0, 128, (4, 32))
    lin_l, exp_l = quantized_targets(learner, qcfg)
    seen_l, hooks_l = _record_inputs({**lin_l, **exp_l})
    seen_e, hooks_e = _record_inputs({n: m for n, m in exe.named_modules()
                                      if isinstance(m, (QuantLinear, FusedQuantSlice, QuantExperts))})
    with torch.no_grad():
        out_e = exe(input_ids=ids).logits  # [4, 32, V]
        with aligned(learner, qcfg):
            out_l = learner(input_ids=ids).logits
        for h in hooks_l + hooks_e:
            h.remove()
        plain = learner(input_ids=ids).logits
    assert seen_l.keys() == seen_e.keys() and len(seen_l) > 0
    flips, total = 0, 0
    for name in seen_l:
        ql, _ = P.quant_act_int8_token(torch.cat(seen_l[name]))
        qe, _ = P.quant_act_int8_token(torch.cat(seen_e[name]))
        flips += (ql != qe).sum().item()
        total += ql.numel()
        if name.endswith("layers.0.self_attn.q_proj"):
            assert torch.equal(ql, qe)  # identical inputs (embeddings + norm): identical codes
    share = flips / total
    record_property("int8_code_flip_share", share)
    print(f"\n[{kind}] differing int8 activation codes, aligned learner vs executor prefill: "
          f"{flips}/{total} = {share:.2e}; max |logit diff| {(out_l - out_e).abs().max().item():.2e}; "
          f"executor vs plain learner {(plain - out_e).abs().max().item():.2e}")
    assert share < 0.1  # a few primary flips, then they cascade down the layers and along the sequence
    gap_aligned = (out_l - out_e).abs().mean()
    gap_plain = (plain - out_e).abs().mean()
    assert gap_aligned < 0.2 * gap_plain  # alignment removes most of the quantization gap; flips cascade the rest
    assert (out_l - out_e).abs().median() < 1e-5  # most logits: fp32 rounding only


def test_aligned_fp8_block128_matches_executor():
    qcfg = QuantConfig(w_format="fp8_e4m3", w_granularity="block128", kv_format="fp8_per_token_head")
    learner = tiny_causal_lm("qwen3", hidden_size=160, head_dim=32, intermediate_size=200)  # K, N not multiples of 128
    exe = make_executor(learner, qcfg)
    ids = torch.randint(0, 128, (2, 16))
    with torch.no_grad():
        out_e = exe(input_ids=ids).logits
        with aligned(learner, qcfg):
            out_l = learner(input_ids=ids).logits
        plain = learner(input_ids=ids).logits
    assert (out_l - out_e).abs().mean() < 0.05 * (plain - out_e).abs().mean()


def test_aligned_gradients_reach_master_weights_straight_through():
    qcfg = QuantConfig()
    learner = tiny_causal_lm("qwen3_moe")
    learner.train()
    ids = torch.randint(0, 128, (2, 12))
    with aligned(learner, qcfg):
        logits = learner(input_ids=ids).logits
    torch.log_softmax(logits.float(), -1)[..., 0].sum().backward()  # backward after exit: graph was built inside
    lin, experts = quantized_targets(learner, qcfg)
    for name, m in {**lin, **experts}.items():
        for p in m.parameters():
            assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name


def test_aligned_quantizes_a_fused_input_once_with_the_same_gradients(monkeypatch):
    """q|k|v and gate|up read one input: its activation is fake-quantized once (as the executor does), and the
    gradients equal those of quantizing it per projection (the STE sums meet in another order)."""
    import importlib

    A = importlib.import_module("interq.quant.aligned")
    qcfg = QuantConfig()
    ids = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(0))
    grads, calls = [], []
    for shared in (True, False):
        torch.manual_seed(0)
        learner = tiny_causal_lm("llama")
        learner.train()
        count = A.P.fq_activation_ste
        monkeypatch.setattr(A.P, "fq_activation_ste", lambda x, q: calls.append(shared) or count(x, q))
        if not shared:
            monkeypatch.setattr(A, "_shared_fq_activation", A.P.fq_activation_ste)
        with aligned(learner, qcfg):
            logits = learner(input_ids=ids).logits
        torch.log_softmax(logits.float(), -1)[..., 0].sum().backward()
        grads.append({n: p.grad for n, p in learner.named_parameters()})
        monkeypatch.undo()
    layers = learner.config.num_hidden_layers
    assert calls.count(True) == 4 * layers  # attention input, o_proj, mlp input, down_proj
    assert calls.count(False) == 7 * layers  # one per projection
    for n, g in grads[0].items():
        torch.testing.assert_close(g, grads[1][n], rtol=1e-5, atol=1e-6, msg=n)


def test_the_shared_activation_is_recomputed_for_another_grad_mode_or_version_and_dropped_on_exit():
    import importlib

    A = importlib.import_module("interq.quant.aligned")
    qcfg = QuantConfig()
    x = torch.randn(4, 32, requires_grad=True) * 1  # [M, K] a non-leaf input
    with aligned(tiny_causal_lm("llama"), qcfg):
        with torch.no_grad():
            off = A._shared_fq_activation(x, qcfg)
        on = A._shared_fq_activation(x, qcfg)
        assert off.grad_fn is None and on.grad_fn is not None and A._shared_fq_activation(x, qcfg) is on
        with torch.no_grad():
            x.mul_(2)  # a new version: quantized again
        again = A._shared_fq_activation(x, qcfg)
        assert again is not on and torch.equal(again, A.P.fq_activation_ste(x, qcfg))
    assert A._LAST_XQ[0] is None


@pytest.mark.parametrize("bits", [8, 4])
def test_aligned_linear_gradient_is_the_ste_identity(bits):
    """dL/dW through fq(W) is dL/d fq(W) exactly (unclipped), and dL/dx through fq(x) likewise, at any width."""
    qcfg = QuantConfig(w_bits=bits, a_bits=bits, kv_bits=bits)
    lin = nn.Linear(32, 8, bias=False)
    x = torch.randn(5, 32, requires_grad=True)
    g = torch.randn(5, 8)
    (aligned_linear_forward(lin, qcfg, None, x) * g).sum().backward()
    xq = P.fake_quant_activation(x, qcfg)
    wq = P.fake_quant_weight(lin.weight, qcfg)
    if bits == 4:
        assert (xq - x).abs().max() > 0.05  # 4-bit: coarse, so the identity is not trivially x
    assert torch.allclose(lin.weight.grad, g.t() @ xq, rtol=1e-5, atol=1e-6)
    assert torch.allclose(x.grad, g @ wq, rtol=1e-5, atol=1e-6)


def test_aligned_restores_the_model_and_refuses_nesting():
    qcfg = QuantConfig()
    learner = tiny_causal_lm("llama")
    ids = torch.randint(0, 128, (1, 8))
    with torch.no_grad():
        before = learner(input_ids=ids).logits
        with aligned(learner, qcfg):
            inside = learner(input_ids=ids).logits
            assert learner.config._attn_implementation.startswith("interq_aligned_kv|")
            with pytest.raises(RuntimeError, match="already"):
                with aligned(learner, qcfg):
                    pass
        after = learner(input_ids=ids).logits
    assert not torch.allclose(inside, before, atol=1e-4)
    assert torch.equal(after, before) and learner.config._attn_implementation == "sdpa"
    assert "forward" not in vars(learner.model.layers[0].self_attn.q_proj)


def test_aligned_kv_only_touches_attention_inputs():
    """kv-only alignment changes the output exactly as the executor with an 8-bit cache and float weights."""
    qcfg = QuantConfig(w_format="none")
    learner = tiny_causal_lm("llama")
    exe = make_executor(learner, qcfg)
    ids = torch.randint(0, 128, (2, 10))
    with torch.no_grad():
        with aligned(learner, qcfg):
            out_l = learner(input_ids=ids).logits
        out_e = exe(input_ids=ids).logits
        plain = learner(input_ids=ids).logits
    assert torch.allclose(out_l, out_e, atol=1e-5)
    assert not torch.allclose(plain, out_e, atol=1e-5)


def _token_logprobs(logits, ids):
    """log p(ids[:, t+1] | ids[:, :t+1]) in fp32: logits [B, T, V], ids [B, T] -> [B, T-1]."""
    return torch.log_softmax(logits.float(), -1)[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)


@pytest.mark.parametrize("bits", [(8, 8, 8), (4, 8, 8), (8, 8, 4), (4, 4, 4), (2, 2, 2)], ids=lambda b: "W{}A{}-KV{}".format(*b))
@pytest.mark.parametrize("kind", ["qwen3", "qwen3_moe"])
def test_aligned_learner_logprobs_match_executor_behavior_at_any_width(kind, bits):
    """The executor's behaviour log-probs (prefill, then token-by-token decode against its quantized cache)
    against the aligned learner's teacher-forced ones at the same widths: one band for every width, the
    band of the 8-bit logits test (under 0.2x the plain learner's gap; median at fp32 rounding)."""
    w_bits, a_bits, kv_bits = bits
    qcfg = QuantConfig(w_bits=w_bits, a_bits=a_bits, kv_bits=kv_bits)
    learner = tiny_causal_lm(kind, num_layers=3)
    exe = make_executor(learner, qcfg)
    ids = torch.randint(0, 128, (4, 24))
    with torch.no_grad():
        cache = make_kv_cache(qcfg, exe.config)
        out = exe(input_ids=ids[:, :8], cache=cache, use_cache=True)
        logits = [out.logits]
        for t in range(8, ids.shape[1]):
            out = exe(input_ids=ids[:, t:t + 1], cache=out.cache, use_cache=True)
            logits.append(out.logits)
        behavior_logprobs = _token_logprobs(torch.cat(logits, 1), ids)  # [4, 23]
        with aligned(learner, qcfg):
            aligned_logprobs = _token_logprobs(learner(input_ids=ids).logits, ids)
        plain_logprobs = _token_logprobs(learner(input_ids=ids).logits, ids)
    gap_aligned = (behavior_logprobs - aligned_logprobs).abs()
    gap_plain = (behavior_logprobs - plain_logprobs).abs()
    print(f"\n[{kind} {qcfg.w_bits}/{qcfg.a_bits}/{qcfg.kv_bits}] mean |behavior - aligned| {gap_aligned.mean():.2e}, "
          f"|behavior - plain| {gap_plain.mean():.2e}")
    assert gap_aligned.mean() < 0.2 * gap_plain.mean()
    assert gap_aligned.median() < 1e-5
    if bits != (8, 8, 8):  # the narrower executor is a farther policy from the plain learner than W8A8-KV8
        with torch.no_grad():
            w8a8 = _token_logprobs(make_executor(learner, QuantConfig())(input_ids=ids).logits, ids)
        assert gap_plain.mean() > 2 * (w8a8 - plain_logprobs).abs().mean()


def test_aligned_kv_gradient_is_the_ste_identity_at_4_bits():
    qcfg = QuantConfig(w_bits=4, a_bits=4, kv_bits=4)
    t = torch.randn(1, 2, 5, 16, requires_grad=True)
    P.fq_kv_ste(t, qcfg).sum().backward()  # per-token-head scales never clip: identity
    assert torch.equal(t.grad, torch.ones_like(t))
