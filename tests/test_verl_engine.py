"""Alignment on verl: the aligned-forward engine registered in verl's EngineRegistry (CPU).

What runs here: the registration through the plugin's import hook on verl's FSDP engine module, verl's
own engine lookup (``EngineRegistry.get_engine_cls`` with ``VERL_ENGINE_VENDOR``), the weight format
against verl's own blockwise fp8 quantizer (what verl sends to vLLM), and the engine's ``forward_step``
wrapper on a tiny Llama. What does not: verl's FSDP engine itself (it needs torch.distributed on CUDA).
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.verl


@pytest.fixture(scope="module")
def E():
    pytest.importorskip("verl")
    import importlib.metadata as md
    import warnings

    md.EntryPoint(name="interq", value="interq.integrations.verl.plugin", group="verl.plugins").load()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # optional engines (megatron, veomni, ...) missing on CPU
        import verl.workers.engine  # noqa: F401  (runs the plugin's hook on the FSDP engine module)
    from verl.workers.engine.base import EngineRegistry
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

    from interq.integrations.verl import engine, plugin

    ns = type("E", (), {})()
    ns.Registry, ns.FSDPLM, ns.engine, ns.plugin = EngineRegistry, FSDPEngineWithLMHead, engine, plugin
    return ns


def test_engine_registered_under_vendor_interq(E, monkeypatch):
    assert "engine" not in E.plugin.STATE.errors, E.plugin.STATE.errors
    monkeypatch.setenv("VERL_ENGINE_DEVICE", "cuda")
    monkeypatch.setenv("VERL_ENGINE_VENDOR", "interq")
    for backend in ("fsdp", "fsdp2"):
        cls = E.Registry.get_engine_cls("language_model", backend)
        assert cls is E.engine.engine_class()
        assert issubclass(cls, E.FSDPLM) and issubclass(cls, E.engine.AlignedForwardMixin)
        assert cls.forward_step is E.engine.AlignedForwardMixin.forward_step
        assert cls.__mro__[2] is E.FSDPLM  # super().forward_step is verl's
    monkeypatch.setenv("VERL_ENGINE_VENDOR", "nvidia")  # any other vendor: verl's stock engine
    assert E.Registry.get_engine_cls("language_model", "fsdp") is E.FSDPLM
    assert E.engine.register_engine() is E.engine.engine_class()  # idempotent (verl asserts on re-registration)


def test_align_config_matches_verl_fp8_rollout(E, monkeypatch):
    from interq.integrations.verl import InterqVerlError

    monkeypatch.delenv("INTERQ_VERL_ALIGN", raising=False)
    q = E.engine.align_qcfg()
    # verl's FP8_BLOCK_QUANT_KWARGS: e4m3, weight_block_size [128, 128], dynamic activations, mlp.gate ignored
    assert (q.w_format, q.w_granularity, q.a_granularity, q.kv_format) == ("fp8_e4m3", "block128", "group128", "none")
    assert "mlp.gate" in q.exclude
    assert E.engine.align_qcfg("none") is None
    assert E.engine.align_qcfg('{"w_format": "int8"}').w_granularity == "channel"
    with pytest.raises(InterqVerlError, match="INTERQ_VERL_ALIGN='fp9' is not accepted; accepted: fp8_block128, "
                       "w8a8_int8, w8a8_int8_kv_int8, w8a8_int8_kv_fp8, none"):
        E.engine.align_qcfg("fp9")
    with pytest.raises(InterqVerlError, match="INTERQ_VERL_ALIGN.*unknown field"):
        E.engine.align_qcfg('{"w_fmt": "int8"}')


def test_weight_format_equals_verl_blockwise_fp8(E):
    """interq's block128 weight codes are the ones verl's weight sync sends to vLLM (same fp8 codes)."""
    from verl.utils.kernel.fp8_kernel import _scaled_fp8_blockwise_pytorch

    from interq.quant import fake_quant_weight, quant_weight_fp8

    g = torch.Generator().manual_seed(0)
    w = torch.randn(300, 260, generator=g) * 0.05  # ragged: 3 x 3 blocks, the last ones partial
    w[5, 7] = 0.9  # one outlier block
    v_q, v_descale = _scaled_fp8_blockwise_pytorch(w, [128, 128])  # fp8 [300, 260], descale [3, 3, 1]
    q, s = quant_weight_fp8(w, "block128")  # fp8 [300, 260], scale [3, 3]
    assert torch.equal(v_q.float(), q.float())
    torch.testing.assert_close(v_descale.reshape(3, 3), s, rtol=2e-7, atol=0)  # 448/amax reciprocal vs amax/448
    dq = v_q.float() * v_descale.reshape(3, 3).repeat_interleave(128, 0).repeat_interleave(128, 1)[:300, :260]
    torch.testing.assert_close(fake_quant_weight(w, E.engine.align_qcfg("fp8_block128")), dq, rtol=2e-7, atol=0)


class _TinyEngine:
    """Stands in for verl's engine base: holds ``self.module`` and runs it in ``forward_step``."""

    def __init__(self, module):
        self.module = module

    def forward_step(self, micro_batch, loss_function, forward_only):
        logits = self.module(input_ids=micro_batch).logits  # [B, T, V]
        return (loss_function(logits) if loss_function else None), logits


def _tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=96, hidden_size=256, intermediate_size=384, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=64, attn_implementation="sdpa")
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).float().eval()


def test_forward_step_runs_the_aligned_forward(E, monkeypatch):
    from interq.quant import aligned

    monkeypatch.setenv("INTERQ_VERL_ALIGN", "fp8_block128")
    Aligned = type("Aligned", (E.engine.AlignedForwardMixin, _TinyEngine), {})
    model = _tiny_llama()
    eng = Aligned(model)
    ids = torch.randint(0, 96, (2, 12), generator=torch.Generator().manual_seed(1))
    loss, logits = eng.forward_step(ids, lambda lg: lg.float().logsumexp(-1).mean(), forward_only=False)
    with torch.no_grad(), aligned(model, eng.interq_qcfg):
        ref = model(input_ids=ids).logits
    with torch.no_grad():
        plain = model(input_ids=ids).logits  # restored after forward_step
    torch.testing.assert_close(logits.detach(), ref, rtol=0, atol=0)
    assert (logits.detach() - plain).abs().max() > 1e-4  # the quantization is really on
    loss.backward()  # the graph built inside the aligned context back-propagates after it (STE)
    assert model.model.layers[0].self_attn.q_proj.weight.grad.abs().sum() > 0
    monkeypatch.setenv("INTERQ_VERL_ALIGN", "none")
    _, off = Aligned(model).forward_step(ids, None, forward_only=True)
    torch.testing.assert_close(off.detach(), plain, rtol=0, atol=0)
