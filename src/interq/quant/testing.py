"""Tiny transformers causal LMs built from a config (no download), and seeded int8 codes, linears and a
weight-sync step, for tests and benchmarks."""

from __future__ import annotations

import torch

KINDS = ("llama", "qwen3", "qwen3_moe")


def tiny_causal_lm(kind: str = "llama", *, vocab_size: int = 128, hidden_size: int = 64, num_layers: int = 2,
                   num_heads: int = 4, num_kv_heads: int = 2, head_dim: int = 16, intermediate_size: int = 96,
                   num_experts: int = 4, experts_per_tok: int = 2, moe_intermediate_size: int = 32,
                   dtype: torch.dtype = torch.float32, seed: int = 0, init_std: float = 0.08):
    """A randomly initialised tiny Llama / Qwen3 / Qwen3-MoE (eval mode). ``init_std`` is larger than
    transformers' 0.02 so that logits are not all near zero and quantization errors are visible."""
    from transformers import (LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig,
                              Qwen3MoeForCausalLM)

    common = dict(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=intermediate_size,
                  num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
                  head_dim=head_dim, max_position_embeddings=512, initializer_range=init_std)
    torch.manual_seed(seed)
    if kind == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    elif kind == "qwen3":
        model = Qwen3ForCausalLM(Qwen3Config(**common))
    elif kind == "qwen3_moe":
        model = Qwen3MoeForCausalLM(Qwen3MoeConfig(**common, num_experts=num_experts,
                                                   num_experts_per_tok=experts_per_tok,
                                                   moe_intermediate_size=moe_intermediate_size))
    else:
        raise ValueError(f"tiny_causal_lm: kind={kind!r} is not one of {KINDS}")
    if kind == "qwen3_moe":  # experts are created empty and the router at zero: give them values
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith(("experts.gate_up_proj", "experts.down_proj", "mlp.gate.weight")):
                    p.normal_(0.0, init_std)
    return model.to(dtype).eval()


def random_codes(shape: tuple[int, ...], seed: int, extremes: bool = True) -> torch.Tensor:
    """Seeded int8 codes over the full range [-128, 127]; ``extremes``: the first three are -128, 127, -128 (the
    products where an unsigned-offset GEMM can go wrong)."""
    g = torch.Generator().manual_seed(seed)
    t = torch.randint(-128, 128, shape, generator=g, dtype=torch.int8)
    if extremes and t.numel() > 4:
        t.view(-1)[:3] = torch.tensor([-128, 127, -128], dtype=torch.int8)
    return t


def seeded_linear(k: int, n: int, bias: bool, seed: int, dtype: torch.dtype = torch.float32) -> torch.nn.Linear:
    """An ``nn.Linear(k, n)`` with seeded weights (std 0.05) and bias (std 0.1), in ``dtype``."""
    g = torch.Generator().manual_seed(seed)
    lin = torch.nn.Linear(k, n, bias=bias)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(n, k, generator=g) * 0.05)
        if bias:
            lin.bias.copy_(torch.randn(n, generator=g) * 0.1)
    return lin.to(dtype)


@torch.no_grad()
def perturb_and_sync(learner: torch.nn.Module, *executors: torch.nn.Module) -> None:
    """A stand-in for an optimizer step: every learner parameter scaled by 1.2 plus noise, then each executor synced
    (:func:`interq.quant.sync_weights`)."""
    from interq.quant.executor import sync_weights

    for p in learner.parameters():
        p.mul_(1.2).add_(0.01 * torch.randn_like(p))
    for exe in executors:
        sync_weights(learner, exe)
