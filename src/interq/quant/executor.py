"""Executor conversion and weight sync (docs/executor.md, "Weight sync").

``make_executor(model, qcfg)`` returns a NEW module (a deep copy; the learner is untouched) of the same
transformers class, so it keeps the Hugging Face forward signature and ``generate``. Every ``nn.Linear``
inside a decoder layer (``...layers.<i>....``) becomes a ``QuantLinear`` and every fused 3-D experts
module a ``QuantExperts``; embeddings, ``lm_head``, norms (incl. ``q_norm`` / ``k_norm``), rotary and the
MoE router stay in high precision, as do linears whose name ends with one of ``qcfg.exclude``.

When ``qcfg.kv_format != 'none'`` and a forward is called without a cache, a fresh 8-bit cache from
``make_kv_cache`` is put in, so even a one-shot prefill attends over quantized K/V. ``generate`` creates
its own ``DynamicCache``: pass ``past_key_values=make_kv_cache(qcfg, executor.config)`` to it.
"""

from __future__ import annotations

import copy
import re
import time

import torch
from torch import nn

from interq._hf import cache_kwarg, with_cache
from interq import kernels
from interq.quant import primitives as P
from interq.quant.config import QuantConfig
from interq.quant.kv_cache import make_kv_cache
from interq.kernels.packed_linear import pack_bf16_linears
from interq.kernels.rms_norm import fuse_rms_norms
from interq.quant.linear import (FusedQuantLinear, FusedQuantSlice, QuantExperts, QuantLinear, can_fuse,
                                 is_fused_experts)

_DECODER = re.compile(r"(^|\.)layers\.\d+\.")
# Fused modules of vLLM (QKVParallelLinear, MergedColumnParallelLinear): one per-tensor scale over the group.
_FUSED = {"q_proj": "qkv", "k_proj": "qkv", "v_proj": "qkv", "gate_proj": "gate_up", "up_proj": "gate_up"}


def _excluded(name: str, qcfg: QuantConfig) -> bool:
    return any(name == s or name.endswith("." + s) for s in qcfg.exclude)


def quantized_targets(model: nn.Module, qcfg: QuantConfig) -> tuple[dict[str, nn.Linear], dict[str, nn.Module]]:
    """(linears, experts) that the executor quantizes, by qualified name (the module policy of the spec)."""
    linears, experts = {}, {}
    for name, mod in model.named_modules():
        if not _DECODER.search(name + ".") or _excluded(name, qcfg):
            continue
        if isinstance(mod, nn.Linear):
            linears[name] = mod
        elif is_fused_experts(mod):
            experts[name] = mod
    return linears, experts


def fused_group(name: str) -> str:
    parent, _, leaf = name.rpartition(".")
    return f"{parent}.{_FUSED.get(leaf, leaf)}"


def group_amaxes(linears: dict[str, nn.Linear], qcfg: QuantConfig) -> dict[str, torch.Tensor | None]:
    """Per-tensor scales are shared over a fused q|k|v or gate|up group (the max of the members' amax);
    other granularities use each module's own amax (None)."""
    if qcfg.w_granularity != "tensor":
        return {n: None for n in linears}
    groups: dict[str, torch.Tensor] = {}
    for n, m in linears.items():
        a = P.weight_amax(m.weight, qcfg)  # [1, 1]
        g = fused_group(n)
        groups[g] = a if g not in groups else torch.maximum(groups[g], a)
    return {n: groups[fused_group(n)] for n in linears}


def fusable_groups(linears: dict[str, nn.Linear], qcfg: QuantConfig) -> dict[str, dict[str, nn.Linear]]:
    """q|k|v and gate|up groups whose GEMMs the executor runs as one (:class:`FusedQuantLinear`), by the name the
    group module gets (``<parent>.qkv_proj``, ``<parent>.gate_up_proj``): int8 weights, every member of the group
    quantized (none excluded) and compatible (:func:`can_fuse`)."""
    if qcfg.w_format != "int8":
        return {}
    by_group: dict[str, dict[str, nn.Linear]] = {}
    for n, m in linears.items():
        if n.rpartition(".")[2] in _FUSED:
            by_group.setdefault(fused_group(n) + "_proj", {})[n] = m
    full = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
    out = {}
    for g, members in by_group.items():
        leaves = tuple(sorted(n.rpartition(".")[2] for n in members))
        want = full[g.rpartition(".")[2]]
        if leaves == tuple(sorted(want)) and can_fuse(list(members.values())):
            parent = g.rpartition(".")[0]
            out[g] = {f"{parent}.{leaf}" if parent else leaf: members[f"{parent}.{leaf}" if parent else leaf]
                      for leaf in want}  # member order: q, k, v / gate, up
    return out


def _inject_cache_hook(module: nn.Module, args, kwargs):
    qcfg = module.interq_qcfg
    kwargs, name = with_cache(module, kwargs), cache_kwarg(module)  # a cache under either name: the one forward takes
    if qcfg.quantizes_kv and kwargs.get(name) is None:
        kwargs[name] = make_kv_cache(qcfg, module.config)
    return args, kwargs


def make_executor(model: nn.Module, qcfg: QuantConfig | None = None, int8_backend: str = "auto",
                  fuse: bool = True, pack_bf16: bool = True, fuse_norms: bool = True) -> nn.Module:
    """A W8A8(-KV8) executor converted from ``model`` (a transformers causal LM); see the module docstring.
    The executor is in eval mode with no trainable parameters; ``executor.interq_qcfg`` is its config.

    ``int8_backend`` chooses how the exact int32 accumulator is computed, not the numerics: ``int_mm``
    (``torch._int_mm``), ``fp32_exact`` (bit-identical, an fp32 GEMM of the integer codes in K-chunks of
    1024; fast on CPUs without VNNI), ``vnni`` (bit-identical, the compiled AVX512-VNNI kernel at decode sizes,
    ``_int_mm`` above), ``amx`` (bit-identical, the compiled AMX-INT8 tile kernel at every size), ``avx2``
    (bit-identical, the compiled AVX2 kernel at every size, for CPUs without AVX-512), ``auto`` (``int_mm`` on
    CUDA; ``amx``, else ``vnni``, on CPUs that have them, else ``int_mm`` on AVX512 CPUs, else ``avx2`` where the
    kernels build, else ``fp32_exact``).

    ``fuse`` (int8 weights): q|k|v and gate|up run as one GEMM each with one activation quantization
    (:class:`FusedQuantLinear`, registered as ``<parent>.qkv_proj`` / ``<parent>.gate_up_proj``; the members stay
    as :class:`FusedQuantSlice` under their names). Speed only: bit-identical to ``fuse=False``, one
    ``QuantLinear`` per linear.

    ``pack_bf16``: the linears that stay ``nn.Linear`` with bf16 weights (``lm_head``; every linear of a bf16
    executor) become :class:`~interq.kernels.packed_linear.PackedBf16Linear` where the CPU's bf16 GEMMs are oneDNN's:
    up to 256 rows, interq's AMX-BF16 kernel or the weight packed once for oneDNN instead of at every call; on CPUs
    without native bf16, at any row count, interq's AVX2 product with the sums of torch's own bf16 kernel there. Speed
    only: the same bits as ``F.linear`` (each shape, row count and thread count checked at its first call;
    ``F.linear`` where no product gives its bits).

    ``fuse_norms``: transformers' Llama / Qwen / Mistral RMSNorms with bf16 weights on the CPU become
    :class:`~interq.kernels.rms_norm.FusedRMSNorm`: one kernel call instead of eight eager ops. Speed only: the same
    bits (torch's own summation order; each module checked against its own output when replaced)."""
    qcfg = QuantConfig() if qcfg is None else qcfg
    if not isinstance(qcfg, QuantConfig):
        raise TypeError(f"make_executor: qcfg must be a QuantConfig, got {type(qcfg).__name__}")
    if qcfg.quantizes_weights or qcfg.quantizes_kv:
        p0 = next(model.parameters(), None)
        if p0 is None or p0.device.type == "cpu":
            kernels.load()  # the fused CPU kernels (same values, fewer ops); built once per machine, else eager ops
    exe = copy.deepcopy(model)
    exe.eval()
    exe.requires_grad_(False)
    if qcfg.quantizes_weights:
        linears, experts = quantized_targets(exe, qcfg)
        if not linears and not experts:
            raise ValueError(f"make_executor: no linear inside a decoder layer ('layers.<i>.') found in "
                             f"{type(model).__name__}; nothing to quantize")
        amaxes = group_amaxes(linears, qcfg)
        groups = fusable_groups(linears, qcfg) if fuse else {}
        fused = set()
        for gname, members in groups.items():
            parent, _, leaf = gname.rpartition(".")
            if hasattr(exe.get_submodule(parent) if parent else exe, leaf):
                continue  # the name is taken: leave these linears unfused
            group = FusedQuantLinear(members, qcfg, {n: amaxes[n] for n in members}, int8_backend)
            kernels.set_module(exe, gname, group)
            for i, n in enumerate(members):
                kernels.set_module(exe, n, FusedQuantSlice(group, i))
                fused.add(n)
        for name, lin in linears.items():
            if name not in fused:
                kernels.set_module(exe, name, QuantLinear(lin, qcfg, amaxes[name], int8_backend))
        for name, ex in experts.items():
            kernels.set_module(exe, name, QuantExperts(ex, qcfg, int8_backend))
    if pack_bf16:
        pack_bf16_linears(exe)
    if fuse_norms:
        fuse_rms_norms(exe)
    exe.interq_qcfg = qcfg
    exe.register_forward_pre_hook(_inject_cache_hook, with_kwargs=True)
    return exe


@torch.no_grad()
def sync_weights(learner: nn.Module, executor: nn.Module) -> float:
    """Re-quantize the learner's current weights into the executor (scales recomputed; copied into the
    existing storage) and copy the high-precision parameters. Returns the seconds it took."""
    t0 = time.perf_counter()
    qcfg: QuantConfig = executor.interq_qcfg
    src = dict(learner.named_modules())
    if qcfg.quantizes_weights:
        linears, _ = quantized_targets(learner, qcfg)
        amaxes = group_amaxes(linears, qcfg)
    for name, mod in executor.named_modules():
        if isinstance(mod, FusedQuantLinear):
            parent = name.rpartition(".")[0]
            names = [f"{parent}.{leaf}" if parent else leaf for leaf in mod.member_names]
            missing = [n for n in names if n not in src]
            if missing:
                raise KeyError(f"sync_weights: learner has no module {missing[0]!r} (was the executor built from it?)")
            mod.requantize([src[n].weight for n in names], [src[n].bias for n in names], [amaxes[n] for n in names])
        elif isinstance(mod, QuantLinear):
            lin = src.get(name)
            if lin is None:
                raise KeyError(f"sync_weights: learner has no module {name!r} (was the executor built from it?)")
            mod.requantize(lin.weight, lin.bias, amaxes[name])
        elif isinstance(mod, QuantExperts):
            mod.requantize(src[name])
    learner_params = dict(learner.named_parameters())
    for name, p in executor.named_parameters():
        lp = learner_params.get(name)
        if lp is None:
            raise KeyError(f"sync_weights: learner has no parameter {name!r}")
        p.copy_(lp)
    return time.perf_counter() - t0
