"""Tiny transformers causal LMs built from a config (no download), for tests and benchmarks."""

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
