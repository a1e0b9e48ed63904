"""The rollout executor's lean Llama decoder-layer forward (interq.rollout.fast_layers): the eager layer's values bit
for bit, and transformers' own forward wherever the lean one could differ."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM
from transformers.models.llama import modeling_llama as ML

from interq import kernels
from interq.quant import BF16_EXECUTOR, QuantConfig, make_executor, make_kv_cache
from interq.rollout import RolloutEngine, SamplingParams
from interq.rollout import fast_layers as FL
from interq.rollout.fast_layers import set_rollout_attention


def _kernels():
    mod = kernels.load()
    if mod is None:
        pytest.skip("needs interq's CPU kernels")
    return mod


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int16)


def _layout(t: torch.Tensor) -> tuple:
    """Shape and the strides of dimensions longer than 1 (a length-1 dimension's stride is never used)."""
    return tuple(t.shape), tuple(st for n, st in zip(t.shape, t.stride()) if n > 1)


def _tiny(layers=2, hidden=192, heads=6, kv_heads=2, head_dim=32, seed=0, intermediate=256) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=96, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
                      max_position_embeddings=2048, attn_implementation="sdpa")
    return LlamaForCausalLM(cfg).bfloat16().eval().requires_grad_(False)


def _rand(gen, shape, spread):
    x = torch.randn(*shape, generator=gen)
    return (x * torch.exp(spread * torch.randn(*shape, generator=gen))).bfloat16()


def _play(model, cache_factory=None):
    """Two turns of three padded episodes: a prefill, decode steps, a masked prefill over the cache, decode."""
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(4, 96, (n,), generator=gen).tolist() for n in (40, 23, 5)]
    batch = RolloutEngine(model, cache_factory=cache_factory).new_batch(
        [1, 2, 3], SamplingParams(temperature=1.0, max_action_tokens=6))
    batch.step({i: p for i, p in enumerate(prompts)})
    batch.step({i: [7, 8, 9] for i in range(3)})
    return batch.close()


def _counting(monkeypatch):
    """Counts the lean forward's runs: the hook check is the last condition before it runs (a call handed over to
    transformers' forward earlier never asks it; one with hooks is handed over by it)."""
    calls = {"lean": 0}
    real = FL._hooked

    def hooked(mods):
        out = real(mods)
        calls["lean"] += not out
        return out

    monkeypatch.setattr(FL, "_hooked", hooked)
    return calls


def _assert_same_episodes(a_list, b_list):
    for a, b in zip(a_list, b_list):
        assert torch.equal(a.token_ids, b.token_ids) and torch.equal(a.behavior_logprobs, b.behavior_logprobs)


def _engine_same(model, monkeypatch, factory=None):
    """The engine's episodes with the lean forward (which must have run) and with transformers' forward."""
    calls = _counting(monkeypatch)
    try:
        lean = _play(model, factory)
        assert calls["lean"] > 0
        FL.use_fast_layers(False)
        eager = _play(model, factory)
    finally:
        FL.use_fast_layers(True)
    _assert_same_episodes(lean, eager)


@pytest.mark.parametrize("executor", ["bf16", "w8a8-kv8", "w8a8"])
@pytest.mark.parametrize("attention", ["sdpa_packed", "sdpa"])
def test_engine_episodes_are_the_same_with_and_without_it(executor, attention, monkeypatch):
    """The engine's tokens and behavior log-probs, bf16 and W8A8 executors (fused q|k|v and gate|up groups, the
    8-bit KV cache), with the lean forward and with transformers'."""
    learner = _tiny()
    qcfg = {"bf16": BF16_EXECUTOR, "w8a8-kv8": QuantConfig(), "w8a8": QuantConfig(kv_format="none")}[executor]
    model = set_rollout_attention(make_executor(learner, qcfg), attention)
    assert all("forward" in vars(layer) for layer in model.model.layers)
    _engine_same(model, monkeypatch, (lambda c: make_kv_cache(qcfg, c)) if qcfg.quantizes_kv else None)


@pytest.mark.parametrize("executor", ["bf16", "w8a8-kv8"])
def test_the_lean_forward_follows_a_weight_sync(executor, monkeypatch):
    """After the executor's weights are synced from a changed learner (int8 codes requantized in place, bf16
    weights copied: their AMX layout made again), the lean forward uses the new weights."""
    from interq.quant import sync_weights

    learner = _tiny()
    qcfg = BF16_EXECUTOR if executor == "bf16" else QuantConfig()
    model = set_rollout_attention(make_executor(learner, qcfg), "sdpa_packed")
    factory = (lambda c: make_kv_cache(qcfg, c)) if qcfg.quantizes_kv else None
    first = _play(model, factory)
    with torch.no_grad():
        gen = torch.Generator().manual_seed(9)
        for p in learner.parameters():
            p.add_((0.1 * p.float().abs().mean() * torch.randn(p.shape, generator=gen)).to(p.dtype))
    sync_weights(learner, model)
    second = _play(model, factory)
    assert not all(torch.equal(a.behavior_logprobs, b.behavior_logprobs) for a, b in zip(first, second))
    _engine_same(model, monkeypatch, factory)


@pytest.mark.parametrize("executor", ["bf16", "w8a8"])
def test_nan_rows_and_many_rows_give_transformers_bits(executor, monkeypatch):
    """A row holding inf (the norms' outputs are NaN: their eager ops decide) and a prefill of more rows than the
    packed bf16 product takes (F.linear): transformers' forward's bits."""
    qcfg = BF16_EXECUTOR if executor == "bf16" else QuantConfig(kv_format="none")
    model = set_rollout_attention(make_executor(_tiny(), qcfg), "sdpa_packed")
    layer = model.model.layers[0]
    gen = torch.Generator().manual_seed(2)
    for b, s in ((3, 1), (2, 5), (3, 100)):
        x = torch.randn(b, s, 192, generator=gen).bfloat16()
        if s < 100:
            x[1, 0, 7] = float("inf")
        pos = model.model.rotary_emb(x, torch.arange(s)[None].expand(b, s))
        with torch.inference_mode():
            FL.use_fast_layers(False)
            ref = layer(x, position_embeddings=pos)
            FL.use_fast_layers(True)
            calls = _counting(monkeypatch)
            out = layer(x, position_embeddings=pos)
        assert calls["lean"] >= 1
        assert torch.equal(_bits(out), _bits(ref)), (b, s)
        if s < 100:
            assert out[1].isnan().any() and not out[0].isnan().any()


def test_model_forward_and_cache_are_the_same():
    """A plain forward with a DynamicCache (as ``generate`` calls it): logits and cached keys bit for bit."""
    model = set_rollout_attention(make_executor(_tiny(), BF16_EXECUTOR), "sdpa_packed")
    ids = torch.randint(4, 96, (2, 9), generator=torch.Generator().manual_seed(3))

    def run():
        cache = DynamicCache(config=model.config)
        first = model(input_ids=ids, cache=cache, use_cache=True).logits
        nxt = model(input_ids=ids[:, :1], cache=cache, use_cache=True).logits
        return first, nxt, cache.layers[1].keys.clone()

    lean = run()
    FL.use_fast_layers(False)
    try:
        eager = run()
    finally:
        FL.use_fast_layers(True)
    for a, b in zip(lean, eager):
        assert torch.equal(_bits(a), _bits(b))


def test_hooks_training_and_gradients_take_transformers_forward(monkeypatch):
    """A forward hook on any submodule (transformers records attentions that way), training mode, or an input that
    needs gradients: transformers' forward runs (the hooks fire), with the same values."""
    model = set_rollout_attention(_tiny(), "sdpa_packed")
    layer = model.model.layers[0]
    x = torch.randn(2, 3, 192, generator=torch.Generator().manual_seed(0)).bfloat16()
    pos = model.model.rotary_emb(x, torch.arange(3)[None].expand(2, 3))
    ref = layer(x, position_embeddings=pos)
    calls = _counting(monkeypatch)
    assert torch.equal(_bits(layer(x, position_embeddings=pos)), _bits(ref)) and calls["lean"] == 1
    fired = []
    handle = layer.self_attn.register_forward_hook(lambda m, a, o: fired.append(1))
    try:
        out = layer(x, position_embeddings=pos)
    finally:
        handle.remove()
    assert fired and calls["lean"] == 1 and torch.equal(_bits(out), _bits(ref))  # handed over
    model.train()
    assert torch.equal(_bits(layer(x, position_embeddings=pos)), _bits(ref))
    model.eval()
    layer.self_attn.train()  # attention dropout would apply: transformers' forward
    assert torch.equal(_bits(layer(x, position_embeddings=pos)), _bits(ref)) and calls["lean"] == 1
    layer.self_attn.eval()
    xg = x.clone().requires_grad_(True)
    out = layer(xg, position_embeddings=pos)
    assert out.requires_grad and torch.equal(_bits(out.detach()), _bits(ref))
    out.float().sum().backward()
    assert xg.grad is not None
    lean_before = calls["lean"]
    assert torch.equal(_bits(layer(x, position_embeddings=pos, output_attentions=True)), _bits(ref))  # unknown kwarg
    assert calls["lean"] == lean_before


def test_a_deep_copy_runs_its_own_modules():
    """``copy.deepcopy`` of an executor with the lean forward binds the copy's layers to the copy's modules."""
    model = set_rollout_attention(make_executor(_tiny(), QuantConfig()), "sdpa_packed")
    ids = torch.randint(4, 96, (2, 7), generator=torch.Generator().manual_seed(5))
    before = model(input_ids=ids).logits
    twin = copy.deepcopy(model)
    assert all(layer.forward.__self__ is layer for layer in twin.model.layers)
    with torch.no_grad():
        for m in twin.modules():  # the copy's norms scaled: its output must move, the original's not
            if type(m).__name__.endswith("RMSNorm"):
                m.weight.mul_(2)
    assert not torch.equal(twin(input_ids=ids).logits, before)
    assert torch.equal(model(input_ids=ids).logits, before)


def test_other_layer_classes_are_left_alone():
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    cfg = Qwen3MoeConfig(vocab_size=64, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_experts=4,
                         num_experts_per_tok=2, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=16, attn_implementation="sdpa")
    model = Qwen3MoeForCausalLM(cfg).eval()
    assert FL.install(model) == 0 and "forward" not in vars(model.model.layers[0])


@pytest.mark.parametrize("executor", ["bf16", "w8a8-kv8", "w8a8"])
@pytest.mark.parametrize("family,window", [("qwen2", None), ("qwen2", 4), ("mistral", None), ("mistral", 4)])
def test_qwen2_and_mistral_engine_episodes_are_the_same_with_and_without_it(family, window, executor, monkeypatch):
    """Qwen2 (q|k|v biases: each product called on its own) and Mistral layers, with and without a sliding window
    (passed on to the attention function; Mistral's read from its config): the engine's episodes with the lean
    forward and with transformers' forward."""
    from transformers import MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM

    if window and executor == "w8a8-kv8":
        pytest.skip("the 8-bit KV cache takes full-attention layers only (make_kv_cache says so)")
    torch.manual_seed(0)
    kw = dict(vocab_size=96, hidden_size=192, intermediate_size=256, num_hidden_layers=2, num_attention_heads=6,
              num_key_value_heads=2, max_position_embeddings=2048, attn_implementation="sdpa")
    if family == "qwen2":
        extra = dict(use_sliding_window=True, sliding_window=window, max_window_layers=1) if window else {}
        model = Qwen2ForCausalLM(Qwen2Config(**kw, **extra))
    else:
        model = MistralForCausalLM(MistralConfig(**kw, head_dim=32, sliding_window=window))
    qcfg = {"bf16": BF16_EXECUTOR, "w8a8-kv8": QuantConfig(), "w8a8": QuantConfig(kv_format="none")}[executor]
    model = set_rollout_attention(make_executor(model.bfloat16().eval().requires_grad_(False), qcfg), "sdpa_packed")
    assert all("forward" in vars(layer) for layer in model.model.layers)
    _engine_same(model, monkeypatch, (lambda c: make_kv_cache(qcfg, c)) if qcfg.quantizes_kv else None)


def _qwen3(hidden=192, heads=6, kv_heads=2, head_dim=32, window=None, seed=0):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    extra = dict(use_sliding_window=True, sliding_window=window, max_window_layers=1) if window else {}
    cfg = Qwen3Config(vocab_size=96, hidden_size=hidden, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
                      max_position_embeddings=2048, rms_norm_eps=1e-6, attn_implementation="sdpa", **extra)
    model = Qwen3ForCausalLM(cfg).bfloat16().eval().requires_grad_(False)
    with torch.no_grad():  # q_norm / k_norm weights away from 1, so that a skipped norm shows
        for layer in model.model.layers:
            layer.self_attn.q_norm.weight.uniform_(0.5, 1.5)
            layer.self_attn.k_norm.weight.uniform_(0.5, 1.5)
    return model


@pytest.mark.parametrize("executor", ["bf16", "w8a8-kv8", "w8a8", "fp32"])
@pytest.mark.parametrize("shape", ["study", "wide", "window"])
def test_qwen3_engine_episodes_are_the_same_with_and_without_it(executor, shape, monkeypatch):
    """Qwen3 layers (q and k normalized per head before the rotary embedding): the study's tiny policy's shape
    (width 64, head_dim 16), a wider one (the one-call flash decode applies), and one whose second
    layer slides a 4-token window (its window passed on; no one-call flash decode there)."""
    if shape == "window" and executor == "w8a8-kv8":
        pytest.skip("the 8-bit KV cache takes full-attention layers only (make_kv_cache says so)")
    model = {"study": lambda: _qwen3(64, 4, 2, 16), "wide": _qwen3, "window": lambda: _qwen3(window=4)}[shape]()
    if shape == "window":
        assert [layer.self_attn.sliding_window for layer in model.model.layers] == [None, 4]
    qcfg = {"bf16": BF16_EXECUTOR, "w8a8-kv8": QuantConfig(), "w8a8": QuantConfig(kv_format="none"),
            "fp32": BF16_EXECUTOR}[executor]
    model = set_rollout_attention(make_executor(model.float() if executor == "fp32" else model, qcfg), "sdpa_packed")
    assert all("forward" in vars(layer) for layer in model.model.layers)
    _engine_same(model, monkeypatch, (lambda c: make_kv_cache(qcfg, c)) if qcfg.quantizes_kv else None)


@pytest.mark.parametrize("qcfg", [QuantConfig(), BF16_EXECUTOR], ids=["w8a8", "bf16"])
def test_lean_calls_equal_the_modules(qcfg):
    """The plan's direct kernel calls (int8 groups and linears, AMX-BF16 products, fused norms) against the modules'
    own forward."""
    _kernels()
    model = set_rollout_attention(make_executor(_tiny(intermediate=256), qcfg), "sdpa_packed")
    layer = model.model.layers[1]
    plan = FL._plan(layer)
    x = _rand(torch.Generator().manual_seed(2), (4, 3, 192), 2.0)
    attn, mlp = layer.self_attn, layer.mlp
    with torch.no_grad():
        for got, want in zip(plan.qkv(x), (attn.q_proj(x), attn.k_proj(x), attn.v_proj(x))):
            assert torch.equal(_bits(got.view(want.shape)), _bits(want))
        for got, want in zip(plan.gate_up(x), (mlp.gate_proj(x), mlp.up_proj(x))):
            assert torch.equal(_bits(got.view(want.shape)), _bits(want))
        h = _rand(torch.Generator().manual_seed(3), (4, 3, 256), 2.0)
        assert torch.equal(_bits(plan.down(h).view(4, 3, -1)), _bits(mlp.down_proj(h)))
        assert torch.equal(_bits(plan.o_proj(x).view(4, 3, -1)), _bits(attn.o_proj(x)))
        assert torch.equal(_bits(plan.norm1(x)), _bits(layer.input_layernorm(x)))
    assert plan.o_proj is not attn.o_proj.forward and plan.norm1 is not layer.input_layernorm.forward  # direct calls




@pytest.mark.parametrize("variant", ["eager_attention", "biases", "no_groups", "fp32"])
def test_other_llama_configurations_are_the_same(variant, monkeypatch):
    """transformers' eager attention (rollout.attention=sdpa keeps it), q/k/v/o and MLP biases, as many KV heads as
    query heads, an fp32 executor: the engine's episodes with and without the lean forward."""
    torch.manual_seed(0)
    kw = dict(vocab_size=96, hidden_size=192, intermediate_size=256, num_hidden_layers=2, num_attention_heads=6,
              num_key_value_heads=2, head_dim=32, max_position_embeddings=2048, attn_implementation="sdpa")
    if variant == "eager_attention":
        kw["attn_implementation"] = "eager"
    elif variant == "biases":
        kw.update(attention_bias=True, mlp_bias=True)
    elif variant == "no_groups":
        kw["num_key_value_heads"] = 6
    model = LlamaForCausalLM(LlamaConfig(**kw)).eval().requires_grad_(False)
    if variant != "fp32":
        model = make_executor(model.bfloat16(), BF16_EXECUTOR)
    model = set_rollout_attention(model, "sdpa" if variant == "eager_attention" else "sdpa_packed")
    _engine_same(model, monkeypatch)


def test_the_deprecated_cache_name_reaches_transformers_forward():
    """A layer called with ``past_key_values=`` (transformers renames it): handed over as given, the cache written."""
    model = set_rollout_attention(_tiny(), "sdpa_packed")
    layer = model.model.layers[0]
    x = torch.randn(2, 3, 192, generator=torch.Generator().manual_seed(0)).bfloat16()
    pos = model.model.rotary_emb(x, torch.arange(3)[None].expand(2, 3))
    caches = [DynamicCache(config=model.config) for _ in range(2)]
    out_new = layer(x, position_embeddings=pos, cache=caches[0], use_cache=True)
    with pytest.warns(Warning):
        out_old = layer(x, position_embeddings=pos, past_key_values=caches[1], use_cache=True)
    assert torch.equal(_bits(out_new), _bits(out_old))
    assert torch.equal(_bits(caches[0].layers[0].keys), _bits(caches[1].layers[0].keys))


def test_turning_the_kernels_off_after_the_first_call_is_followed(monkeypatch):
    """The plan is gathered again when the kernels are turned off (and its calls are the modules' own then)."""
    _kernels()
    model = set_rollout_attention(make_executor(_tiny(), QuantConfig()), "sdpa_packed")
    factory = lambda c: make_kv_cache(QuantConfig(), c)  # noqa: E731
    before = _play(model, factory)
    kernels.set_enabled(False)
    try:
        assert FL._plan(model.model.layers[0]).kernels is None
        off = _play(model, factory)
    finally:
        kernels.set_enabled(True)
    _assert_same_episodes(before, off)


def test_a_replaced_submodule_is_called():
    """Replacing a projection after the first call: the next call uses the new module."""
    model = set_rollout_attention(make_executor(_tiny(), BF16_EXECUTOR), "sdpa_packed")
    ids = torch.randint(4, 96, (2, 7), generator=torch.Generator().manual_seed(5))
    before = model(input_ids=ids).logits
    attn = model.model.layers[0].self_attn
    new = torch.nn.Linear(attn.o_proj.in_features, attn.o_proj.out_features, bias=False).bfloat16().requires_grad_(False)
    with torch.no_grad():
        new.weight.copy_(attn.o_proj.weight * 3)
    attn.o_proj = new
    after = model(input_ids=ids).logits
    FL.use_fast_layers(False)
    try:
        eager = model(input_ids=ids).logits
    finally:
        FL.use_fast_layers(True)
    assert not torch.equal(after, before) and torch.equal(_bits(after), _bits(eager))


def test_a_patched_layer_class_is_left_alone(monkeypatch):
    """A layer class whose forward was patched at the class (another library's kernels) gets no lean forward."""
    monkeypatch.setattr(ML.LlamaMLP, "forward", lambda self, x: self.down_proj(x))
    model = _tiny()
    assert FL.install(model) == 0


def _kernels_package_layer():
    """A layer whose attention routes the rotary embedding to its own copy (Hugging Face's ``kernels`` package
    installed, as transformers 5.25 requires), or a skip."""
    model = set_rollout_attention(_tiny(), "sdpa_packed")
    funcs = vars(model.model.layers[0].self_attn).get("_kernel_funcs")
    if not funcs:
        pytest.skip("transformers here does not route the rotary embedding through the kernels package")
    return model, funcs


def test_the_kernels_packages_rotary_routing_keeps_the_lean_forward(monkeypatch):
    """With the kernels package, ``apply_rotary_pos_emb`` is a function module that the attention routes to its own
    copy; the lean forward calls that copy, with the eager layer's values."""
    model, _ = _kernels_package_layer()
    assert FL.install(model) == len(model.model.layers)
    _engine_same(model, monkeypatch)


def test_a_kernelized_rotary_embedding_is_called(monkeypatch):
    """Once ``kernels.kernelize`` gives the attention's copy a forward of its own (a hub kernel), the lean forward
    calls that forward, as transformers' routing does; also when the layer ran before."""
    import types

    model, funcs = _kernels_package_layer()
    layer = model.model.layers[0]
    x = torch.randn(2, 3, 192, generator=torch.Generator().manual_seed(0)).bfloat16()
    pos = model.model.rotary_emb(x, torch.arange(3)[None].expand(2, 3))
    calls = _counting(monkeypatch)
    plain = layer(x, position_embeddings=pos)
    assert calls["lean"] == 1
    (own,) = funcs.values()
    ran = []

    def hub_kernel(self, q, k, cos, sin, *args, **kwargs):  # stands for a hub kernel: visibly other values
        ran.append(1)
        return q * 2, k

    own.forward = types.MethodType(hub_kernel, own)
    try:
        lean = layer(x, position_embeddings=pos)
        assert calls["lean"] == 2 and len(ran) == 1 and not torch.equal(lean, plain)
        FL.use_fast_layers(False)
        assert torch.equal(_bits(layer(x, position_embeddings=pos)), _bits(lean)) and len(ran) == 2
    finally:
        FL.use_fast_layers(True)
        del own.forward
    assert torch.equal(_bits(layer(x, position_embeddings=pos)), _bits(plain)) and calls["lean"] == 3


def test_other_kernel_functions_leave_the_layer_alone():
    """An attention routing a function other than the rotary embedding (or more of them) is not reproduced."""
    model, funcs = _kernels_package_layer()
    layer = copy.deepcopy(model.model.layers[0])
    vars(layer.self_attn)["_kernel_funcs"] = {**funcs, "other": next(iter(funcs.values()))}
    del layer.forward
    assert FL.install(layer) == 0


def _layer_and_input(qcfg=BF16_EXECUTOR):
    model = set_rollout_attention(make_executor(_tiny(), qcfg), "sdpa_packed")
    layer = model.model.layers[0]
    x = torch.randn(3, 4, 192, generator=torch.Generator().manual_seed(4)).bfloat16()  # 4 tokens: q and k matter
    return model, layer, x, model.model.rotary_emb(x, torch.arange(4)[None].expand(3, 4))


def _transformers_forward(layer, x, pos):
    try:
        FL.use_fast_layers(False)
        return layer(x, position_embeddings=pos)
    finally:
        FL.use_fast_layers(True)


@pytest.mark.parametrize("qcfg", [BF16_EXECUTOR, QuantConfig()], ids=["bf16", "w8a8"])
@pytest.mark.parametrize("part", ["act_fn", "post_attention_layernorm", "down_proj", "q_proj"])
def test_a_forward_patched_on_a_part_after_the_first_call_is_called(qcfg, part, monkeypatch):
    """An instance ``forward`` given to a submodule after the layer ran (``kernels.kernelize``, another library's
    patch) is called by the lean forward too (the plan is gathered again)."""
    model, layer, x, pos = _layer_and_input(qcfg)
    with torch.inference_mode():
        layer(x, position_embeddings=pos)
        owner = {"act_fn": layer.mlp, "down_proj": layer.mlp, "q_proj": layer.self_attn}.get(part, layer)
        module = getattr(owner, part)
        own = type(module).forward
        module.forward = lambda t, m=module: own(m, t) * 2  # visibly other values
        try:
            ref = _transformers_forward(layer, x, pos)
            assert torch.equal(_bits(layer(x, position_embeddings=pos)), _bits(ref))
        finally:
            del module.forward
        assert not torch.equal(_bits(layer(x, position_embeddings=pos)), _bits(ref))


def test_a_rope_function_replaced_after_install_is_called_and_never_crashes(monkeypatch):
    """The modeling module's rotary function replaced after install (before or after the first call), or the
    attention given another routed function: the layer still runs, with transformers' values."""
    model, layer, x, pos = _layer_and_input()
    with torch.inference_mode():
        layer(x, position_embeddings=pos)
        real = ML.apply_rotary_pos_emb
        monkeypatch.setattr(ML, "apply_rotary_pos_emb", lambda q, k, cos, sin, *a, **kw: (q * 2, k))
        ref = _transformers_forward(layer, x, pos)
        assert torch.equal(_bits(layer(x, position_embeddings=pos)), _bits(ref))
        monkeypatch.setattr(ML, "apply_rotary_pos_emb", real)
        funcs = vars(layer.self_attn).get("_kernel_funcs")
        if funcs:  # the kernels package: a second routed function after the first call hands over
            funcs["other"] = next(iter(funcs.values()))
            try:
                ref = _transformers_forward(layer, x, pos)
                assert torch.equal(_bits(layer(x, position_embeddings=pos)), _bits(ref))
            finally:
                del funcs["other"]
