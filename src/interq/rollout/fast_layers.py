"""A lean forward for a rollout executor's Llama-like decoder layers: the same operations, fewer Python calls.

At a rollout's sizes (SmolLM2-135M, 16 rows, one new token per row) a decode step is dominated by per-call
overhead, not arithmetic: with the same 30 layers at a tiny width a step still took 38-45 ms on one core
(an Intel Xeon with AMX, 2026-12-03). transformers' ``LlamaDecoderLayer`` goes through nine module
calls per layer (each ``Module.__call__`` with its hook checks, two with a deprecated-argument wrapper), the fused
q|k|v and gate|up groups of the int8 executor hand their members' outputs out one module call at a time, and the
rotary embedding is ten eager ops (``q * cos + rotate_half(q) * sin`` for q and k).

:func:`install` gives each Llama, Qwen3, Qwen2 or Mistral decoder layer of a model (:data:`LAYER_CLASSES`: Llama's layer
and MLP; Qwen3's attention also normalizes q and k per head, Qwen2's, Qwen3's and Mistral's pass a sliding window on) an
instance ``forward`` that calls its submodules' ``forward`` directly in transformers' order and runs a fused q|k|v
(gate|up) group in one call. Every value is the eager layer's, bit for bit (tested: the engine's tokens and log-probs
with and without it). A call takes transformers' own forward where the lean one could differ: in training mode, with
gradients asked for, with forward hooks on any submodule (transformers records attentions and hidden states by hooks),
or under argument names this code does not know. Other layer classes are left alone.

:func:`set_rollout_attention` installs it on every rollout executor (with the attention function); ``use_fast_layers(False)`` (or
``INTERQ_FAST_LAYERS=0``) makes every layer take transformers' forward again, for side-by-side timing.
"""

from __future__ import annotations

import sys
import types
import weakref

import torch
from torch import nn

from interq import switches
from interq.rollout import attention as A

# whose forward (transformers 5) the lean forward reproduces: Llama's, and those with Llama's layer and MLP whose
# attention differs from Llama's only in what _Plan reads: Qwen2 and Mistral pass a sliding window on to the attention
# function (Qwen2's q|k|v have biases), Qwen3 also normalizes q and k per head before the rotary embedding
LAYER_CLASSES = ("LlamaDecoderLayer", "Qwen3DecoderLayer", "Qwen2DecoderLayer", "MistralDecoderLayer")
_STATE = {"enabled": switches.flag("INTERQ_FAST_LAYERS")}  # refused unless accepted
_KNOWN_KWARGS = frozenset({"cache_position"})  # other arguments the layer may take and passes on unchanged


def use_fast_layers(enabled: bool) -> None:
    """Turn the lean layer forward on or off for this process (on by default unless ``INTERQ_FAST_LAYERS=0``)."""
    _STATE["enabled"] = bool(enabled)


def _int8_call(module: nn.Module, sizes: list[int]):
    """x [..., K] -> a list of [M, N_i] outputs (or None: the module's own forward is needed) by one call of the
    kernels' ``int8_linear_amx`` or ``int8_linear_avx2``, for an int8 module (:class:`QuantLinear` or a
    :class:`FusedQuantLinear` group) whose forward would make that same call (:func:`interq.quant.linear.whole_linear`:
    its module-side conditions checked here once, its input-side ones per call); None for other modules. The
    kernel's name is the call's ``kernel`` attribute."""
    from interq import kernels
    from interq.quant.linear import whole_linear_kernel, whole_linear_takes

    mod = kernels.get()
    qcfg = getattr(module, "qcfg", None)
    if mod is None or qcfg is None or qcfg.w_format != "int8":
        return None
    name = whole_linear_kernel(module.weight_q, getattr(module, "weight_vnni", None), module.bias,
                               qcfg.a_int8_rounding, getattr(module, "int8_backend", None))
    if name is None or not hasattr(mod, name):
        return None
    k, qmax, buffers, kernel = module.in_features, _qmax(module), module._buffers, getattr(mod, name)

    def call(x):
        if not whole_linear_takes(x):
            return None
        return kernel(x.reshape(-1, k).contiguous(), buffers["weight_vnni"], buffers["weight_scale"], sizes, qmax,
                      x.dtype)

    call.kernel = name

    return call


def _bf16_call(module: nn.Module):
    """x [..., K] -> [[M, N]] (or None: the module's own forward is needed) by one call of the kernels' AMX-BF16 or
    AVX2 product, for a :class:`~interq.kernels.packed_linear.PackedBf16Linear` whose forward would make that same call
    (:meth:`~interq.kernels.packed_linear.PackedBf16Linear.product`); None for other modules."""
    from interq import kernels
    from interq.kernels.packed_linear import PackedBf16Linear, _amx_product, _avx2_product

    mod = kernels.get()
    if type(module) is not PackedBf16Linear or mod is None or not hasattr(mod, "bf16_linear_amx"):
        return None
    k, n = module.in_features, module.out_features

    def call(x):
        product, kb, m = module.product(x)
        if product == "amx":
            return [_amx_product(x.view(m, k), module.amx_weight(), n, module.bias, kb)]
        if product == "avx2":
            return [_avx2_product(x.view(m, k), module.avx2_weight(), n, module.bias)]
        return None

    return call


def _patched(module) -> bool:
    """Whether the module was given an instance ``forward`` (``kernels.kernelize``, another library's patch): then
    that forward is called, never a kernel in its place."""
    return module is not None and "forward" in module.__dict__


def _whole_group(mods: list[nn.Module]):
    """The int8 executor's fused group whose members ``mods`` are, all of them in order; else None."""
    from interq.quant.linear import FusedQuantSlice

    group = getattr(mods[0], "group", None)
    if (all(isinstance(m, FusedQuantSlice) and m.group is group for m in mods)
            and [m.index for m in mods] == list(range(len(group.sizes)))):
        return group
    return None


def _project(mods: list[nn.Module]):
    """x [B, S, K] -> one output per module of ``mods`` ([B, S, N_i], or [B * S, N_i] from the int8 kernel): the
    int8 executor's fused group in one call where ``mods`` are all its members in order, else each module's own."""
    if any(_patched(m) for m in (*mods, getattr(mods[0], "group", None))):
        forwards = [m.forward for m in mods]
        return forwards[0] if len(mods) == 1 else (lambda x: tuple(f(x) for f in forwards))
    group = _whole_group(mods)
    if group is not None:
        call = _int8_call(group, list(group.sizes))
        if call is None:
            return group.forward
        forward = group.forward
        return lambda x: call(x) or forward(x)
    if len(mods) == 1:
        call = _int8_call(mods[0], [mods[0].out_features]) if hasattr(mods[0], "out_features") else None
        call = call or _bf16_call(mods[0])
        forward = mods[0].forward
        if call is None:
            return forward
        return lambda x: (call(x) or [forward(x)])[0]
    forwards = [_project([m]) for m in mods]
    return lambda x: tuple(f(x) for f in forwards)


def _norm(norm: nn.Module):
    """x -> the norm's output: the fused RMSNorm's kernel called directly where its forward would call it."""
    from interq import kernels
    from interq.kernels.rms_norm import kernel_takes

    forward, mod, fused = norm.forward, kernels.get(), _fused_norm(norm)
    if mod is None or fused is None:
        return forward
    params, eps, lanes = fused

    def call(x):
        weight = params["weight"]
        if not kernel_takes(x, weight):
            return forward(x)
        out, nan = mod.rms_norm_bf16(x, weight, eps, lanes)
        return forward(x) if nan else out

    return call


def _qmax(module: nn.Module) -> int:
    from interq.quant.config import int_qmax

    return int_qmax(module.qcfg.a_bits)


def _fused_norm(norm: nn.Module):
    """(the module's parameters, eps, lanes) of a fused RMSNorm whose forward calls ``rms_norm_bf16``, else None."""
    from interq.kernels.rms_norm import FusedRMSNorm

    if (type(norm) is not FusedRMSNorm or norm.weight.dtype != torch.bfloat16 or norm.weight.device.type != "cpu"
            or _patched(norm)):
        return None
    return norm._parameters, float(norm.variance_epsilon), norm.lanes


def _hooked(mods: tuple[nn.Module, ...]) -> bool:
    from torch.nn.modules import module as M

    if M._global_forward_hooks or M._global_forward_pre_hooks:
        return True
    return any(m._forward_hooks or m._forward_pre_hooks for m in mods)


_PARTS = (("input_layernorm",), ("post_attention_layernorm",), ("self_attn", "q_proj"), ("self_attn", "k_proj"),
          ("self_attn", "q_norm"), ("self_attn", "k_norm"),
          ("self_attn", "v_proj"), ("self_attn", "o_proj"), ("mlp", "gate_proj"), ("mlp", "up_proj"),
          ("mlp", "down_proj"), ("mlp", "act_fn"))


_NO_FUNCS: dict = {}


def _parts(layer: nn.Module) -> tuple:
    """What the plan depends on, read from the modules' own registries (cheap enough for every call): the submodules
    the lean forward calls and any instance ``forward`` given to them later (``kernels.kernelize``, another library's
    patch), the modeling module's rotary function, and the attention's own copies of kernel functions
    (:func:`_rope_function`)."""
    attn, mlp = layer._modules["self_attn"], layer._modules["mlp"]
    owner = {"self_attn": attn, "mlp": mlp}
    mods = (attn, mlp, *((owner[p[0]] if len(p) == 2 else layer)._modules.get(p[-1]) for p in _PARTS))
    funcs = attn.__dict__.get("_kernel_funcs", _NO_FUNCS).values()
    return (*mods, *(m.__dict__.get("forward") if m is not None else None for m in mods),
            getattr(sys.modules[type(attn).__module__], "apply_rotary_pos_emb", None), *funcs,
            *(f.__dict__.get("forward") for f in funcs))


def _kernel_func_name(fn) -> str | None:
    """The key under which Hugging Face's ``kernels`` package files a function module in a module's
    ``_kernel_funcs`` (``use_kernelized_func``)."""
    return getattr(fn, "__name__", None) or getattr(fn, "kernel_layer_name", None)


def _rope_function(attn: nn.Module, modeling):
    """What ``LlamaAttention.forward`` calls for the rotary embedding, or None where the attention routes other
    functions than this one (the lean forward does not reproduce it).

    Where Hugging Face's ``kernels`` package is installed (transformers 5.25 requires it), the modeling module's
    ``apply_rotary_pos_emb`` is a function module wrapping transformers' function, and the attention class's forward
    (``use_kernelized_func``) routes each call to the attention's own copy in ``_kernel_funcs``, to which
    ``kernels.kernelize`` may give a hub kernel's forward (an instance ``forward``). The lean forward calls that copy,
    as the routing would."""
    fn = modeling.apply_rotary_pos_emb
    funcs = attn.__dict__.get("_kernel_funcs", _NO_FUNCS)
    if not funcs:
        return fn
    own = funcs.get(_kernel_func_name(fn)) if isinstance(fn, nn.Module) else None
    if own is None or type(own) is not type(fn) or len(funcs) != 1:
        return None
    return own


class _Plan:
    """What the lean forward of one layer calls, gathered once (kept apart from the layer, so that a deep copy of
    the model does not carry callables bound to this layer's modules: the copy gathers its own). Gathered again
    when any of those modules is replaced or the kernels are turned on or off (:func:`_plan`)."""

    def __init__(self, layer: nn.Module, parts: tuple, kernels_module):
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        self.parts, self.kernels = parts, kernels_module
        attn, mlp = layer.self_attn, layer.mlp
        self.attn = attn
        self.qkv = _project([attn.q_proj, attn.k_proj, attn.v_proj])
        self.gate_up = _project([mlp.gate_proj, mlp.up_proj])
        self.norm1, self.norm2 = _norm(layer.input_layernorm), _norm(layer.post_attention_layernorm)
        self.o_proj, self.down = _project([attn.o_proj]), _project([mlp.down_proj])
        # Qwen3: q and k normalized per head (over head_dim) before the rotary embedding
        qk_norms = attn._modules.get("q_norm"), attn._modules.get("k_norm")
        self.qk_norm = tuple(_norm(m) for m in qk_norms) if qk_norms[0] is not None else None
        # the sliding window the attention passes on: Qwen2's and Qwen3's attribute, Mistral's config (read per call)
        family = type(layer).__name__[: -len("DecoderLayer")]
        self.window = ((lambda: {"sliding_window": attn.sliding_window}) if family in ("Qwen2", "Qwen3")
                       else (lambda: {"sliding_window": getattr(attn.config, "sliding_window", None)})
                       if family == "Mistral" else dict)
        self.act = mlp.act_fn.forward if isinstance(mlp.act_fn, nn.Module) else mlp.act_fn
        modeling = sys.modules[type(attn).__module__]
        # None: the attention routes functions this code does not reproduce (since install): every call hands over
        rope = _rope_function(attn, modeling)
        self.handover = rope is None
        self.rope = rope or modeling.apply_rotary_pos_emb
        self.eager_attention = modeling.eager_attention_forward
        self.attention_functions = ALL_ATTENTION_FUNCTIONS
        self.mods = tuple(m for m in layer.modules() if m is not layer) + tuple(
            m for m in attn.__dict__.get("_kernel_funcs", _NO_FUNCS).values() if isinstance(m, nn.Module))


_PLANS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _plan(layer: nn.Module) -> _Plan:
    from interq import kernels

    plan = _PLANS.get(layer)
    parts, mod = _parts(layer), kernels.get()
    if (plan is None or plan.kernels is not mod or len(parts) != len(plan.parts)
            or any(a is not b for a, b in zip(parts, plan.parts))):
        plan = _PLANS[layer] = _Plan(layer, parts, mod)
    return plan


_LAYER_ARGS = ("attention_mask", "position_ids", "cache", "use_cache", "position_embeddings")


def _lean_forward(layer, *args, **kwargs):
    """A ``LlamaDecoderLayer``'s forward with fewer calls (see the module docstring); bound to the layer by
    :func:`install`. Takes transformers' forward, with the arguments as given, wherever it could differ."""
    if not _STATE["enabled"]:
        return type(layer).forward(layer, *args, **kwargs)
    plan = _plan(layer)
    hidden_states = args[0] if len(args) == 1 else None
    position_embeddings = kwargs.get("position_embeddings")
    if (plan.handover or hidden_states is None or position_embeddings is None
            or not _KNOWN_KWARGS.issuperset(k for k in kwargs if k not in _LAYER_ARGS)
            or layer.training or plan.attn.training or (torch.is_grad_enabled() and hidden_states.requires_grad)
            or _hooked(plan.mods)):
        return type(layer).forward(layer, *args, **kwargs)
    attention_mask, cache = kwargs.get("attention_mask"), kwargs.get("cache")
    attn = plan.attn
    b, s = hidden_states.shape[:2]
    d = attn.head_dim
    q, k, v = plan.qkv(plan.norm1(hidden_states))  # [B, S, H * D], [B, S, Hkv * D] x 2
    q, k = q.view(b, s, -1, d), k.view(b, s, -1, d)
    if plan.qk_norm is not None:
        q, k = plan.qk_norm[0](q), plan.qk_norm[1](k)
    q, k = plan.rope(q.transpose(1, 2), k.transpose(1, 2), *position_embeddings)
    v = v.view(b, s, -1, d).transpose(1, 2)  # [B, Hkv, S, D]
    # what LlamaAttention passes on to the cache and the attention function: the layer's arguments but these
    passed = {"position_ids": kwargs.get("position_ids"), "use_cache": kwargs.get("use_cache", False),
              **{k_: v_ for k_, v_ in kwargs.items() if k_ not in _LAYER_ARGS}}
    if cache is not None:
        k, v = cache.update(k, v, attn.layer_idx, kwargs=passed)
    impl = attn.config._attn_implementation
    window = plan.window()
    out = None
    if (s == 1 and impl == A.NAME and attn.num_key_value_groups > 1
            and window.get("sliding_window") is None):  # sdpa_packed's one-call decode, directly
        out = A.flash_decode_rows(q, k, v, attention_mask, attn.scaling, attn.num_key_value_groups)
    if out is None:
        attention = plan.attention_functions.get_interface(impl, plan.eager_attention)
        out, _ = attention(attn, q, k, v, attention_mask, dropout=0.0, scaling=attn.scaling, **window, **passed)
        out = out.reshape(b, s, -1).contiguous()
    hidden_states = hidden_states + plan.o_proj(out).view(b, s, -1)
    gate, up = plan.gate_up(plan.norm2(hidden_states))
    return hidden_states + plan.down(plan.act(gate) * up).view(b, s, -1)


def _is_transformers(fn, modeling, name: str) -> bool:
    """Whether ``fn`` is transformers' own ``name`` of the modeling module (not a replacement patched in)."""
    return getattr(fn, "__module__", None) == modeling.__name__ and getattr(fn, "__qualname__", None) == name


def _reproducible(layer: nn.Module) -> bool:
    """Whether the lean forward reproduces this layer's: transformers' own layer, attention and MLP forwards of a
    family of :data:`LAYER_CLASSES` (not patched at the class; the attention's may carry the ``kernels`` package's routing of the rotary
    embedding, :func:`_rope_function`), taking the cache as ``cache`` (transformers 5)."""
    import inspect

    modeling = sys.modules[type(layer).__module__]
    attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    if attn is None or mlp is None or getattr(attn, "config", None) is None:
        return False
    family = type(layer).__name__[: -len("DecoderLayer")]  # "Llama", "Qwen3", "Qwen2", "Mistral"
    own = (type(layer).forward, f"{family}DecoderLayer.forward"), (type(attn).forward, f"{family}Attention.forward"), \
        (type(mlp).forward, f"{family}MLP.forward")
    if not all(_is_transformers(fn, modeling, name) for fn, name in own):
        return False
    # kernel functions routed by the kernels package: only the attention's rotary embedding is reproduced
    if any("_kernel_funcs" in vars(m) for m in (layer, mlp)) or _rope_function(attn, modeling) is None:
        return False
    try:
        return "cache" in inspect.signature(type(layer).forward).parameters
    except (TypeError, ValueError):
        return False


def install(model: nn.Module) -> int:
    """Give every decoder layer of :data:`LAYER_CLASSES` in ``model`` whose forward it reproduces the lean forward
    (transformers' own classes, unpatched); -> how many layers have it. A layer whose submodules are replaced later
    gathers them again at its next call. The instance ``forward`` does not survive pickling (``torch.save`` of the
    whole module): save a state dict."""
    n = 0
    for layer in model.modules():
        if type(layer).__name__ not in LAYER_CLASSES:
            continue
        if not _reproducible(layer):
            continue
        layer.forward = types.MethodType(_lean_forward, layer)  # a deep copy of the model binds it to the copy
        _PLANS.pop(layer, None)  # gathered again at the next call (the modules may have been replaced)
        n += 1
    return n


def set_rollout_attention(model: torch.nn.Module, attention: str) -> torch.nn.Module:
    """Give a rollout executor (a transformers model the caller owns: not the learner) the attention ``attention``
    (one of :data:`interq.rollout.attention.ATTENTION_CHOICES`; ``sdpa`` keeps transformers' own) and its Llama
    decoder layers the lean forward of this module (the same values, fewer calls). -> the model. It lives here, above
    :mod:`interq.rollout.attention`, because it sets both."""
    if attention not in A.ATTENTION_CHOICES:
        raise ValueError(f"rollout.attention must be one of {list(A.ATTENTION_CHOICES)}, got {attention!r}")
    config = getattr(model, "config", None)
    current = getattr(config, "_attn_implementation", None)
    if attention != "sdpa" and current not in ("sdpa", A.NAME):
        raise ValueError(f"rollout.attention={attention} needs a model with transformers' sdpa attention; "
                         f"{type(model).__name__} uses {current!r}")
    install(model)  # the lean decoder-layer forward (the same values)
    if attention == "sdpa":
        return model
    A.register()
    param = next(model.parameters(), None)
    if param is None or param.device.type == "cpu":
        from interq import kernels

        kernels.load()  # built once per machine: sdpa_packed's one-call decode (else torch's)
    model.set_attn_implementation(A.NAMES[attention])
    return model
