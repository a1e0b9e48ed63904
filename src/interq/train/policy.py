"""The policy: a tokenizer trained on environment text and a small Qwen3 / Qwen3-MoE built from a config.

Both are saved in the standard formats (``model.safetensors`` + ``config.json``, ``tokenizer.json`` +
``tokenizer_config.json``) so that :func:`load_policy` reads a tiny policy, SmolLM2-135M-Instruct or any
transformers causal-LM checkpoint directory with the same code.

With a 49k vocabulary ~90% of a tiny model's parameters sit in the embedding (practical.md); a byte-level
BPE of a few hundred tokens trained on the environment's own text keeps the model at ~100k parameters, so it
trains on a CPU in minutes.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import torch

from interq.train.config import ConfigError, ModelConfig


def chat_special_tokens() -> tuple[str, ...]:
    """The special tokens of the engine's minimal chat format (the engine owns them), pad first, so the tokenizer
    carries exactly the tokens the engine renders. ``interq.rollout`` is part of interq, not an optional extra:
    an error importing it is raised as it is."""
    from interq.rollout.chat import MINIMAL_SPECIAL_TOKENS

    return tuple(dict.fromkeys(("<|pad|>", *MINIMAL_SPECIAL_TOKENS)))


def train_tokenizer(texts: Iterable[str], vocab_size: int, special_tokens: tuple[str, ...] | None = None):
    """A byte-level BPE (``tokenizers``) trained on ``texts``, wrapped as a transformers fast tokenizer.

    Byte-level means every string round-trips (no unknown token), so any generated action decodes.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    special = tuple(special_tokens or chat_special_tokens())
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(special),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(texts), trainer=trainer)
    pad = special[0]
    eos = next((t for t in special if "eos" in t or "end" in t), special[-1])
    bos = next((t for t in special if "bos" in t), None)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=pad, eos_token=eos, bos_token=bos,
                                   additional_special_tokens=[t for t in special if t not in (pad, eos, bos)])
    return fast


def tiny_model_config(cfg: ModelConfig, tokenizer):
    """A transformers config for a small Qwen3 (dense) or Qwen3-MoE sized to ``tokenizer``."""
    common = dict(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim,
        max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
        rms_norm_eps=1e-6,
    )
    if cfg.arch == "qwen3":
        from transformers import Qwen3Config

        return Qwen3Config(intermediate_size=cfg.intermediate_size, **common)
    if cfg.arch == "qwen3_moe":
        from transformers import Qwen3MoeConfig

        return Qwen3MoeConfig(
            intermediate_size=cfg.intermediate_size,
            moe_intermediate_size=cfg.moe_intermediate_size,
            num_experts=cfg.num_experts,
            num_experts_per_tok=cfg.num_experts_per_tok,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            norm_topk_prob=True,
            output_router_logits=False,
            **common,
        )
    raise ConfigError(f"model.arch={cfg.arch!r} is not accepted; choose one of ['qwen3', 'qwen3_moe']")


def _dtype(name: str) -> torch.dtype:
    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[name]


def build_tiny_policy(cfg: ModelConfig, texts: Iterable[str], seed: int = 0):
    """(model, tokenizer): tokenizer trained on ``texts``, model freshly initialised (seeded)."""
    from transformers import AutoModelForCausalLM

    tokenizer = train_tokenizer(texts, cfg.vocab_size)
    mcfg = tiny_model_config(cfg, tokenizer)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(mcfg, dtype=_dtype(cfg.dtype))
    return model, tokenizer


def save_policy(model, tokenizer, path: str | Path) -> Path:
    """Write ``model.safetensors`` + ``config.json`` + ``tokenizer.json`` into ``path`` (created)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    return path


def load_policy(source: str | Path, dtype: str = "float32"):
    """(model, tokenizer) from a checkpoint directory, or ``"smollm2"`` for the offline SmolLM2-135M."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if str(source) == "smollm2":
        from interq.models.pretrained import smollm2_dir

        source = smollm2_dir()
    path = Path(source)
    if not (path / "config.json").is_file():
        raise ConfigError(f"model.source={str(source)!r}: no config.json there; expected a transformers checkpoint directory")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=_dtype(dtype))
    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def count_parameters(model) -> int:
    return sum(p.numel() for p in model.parameters())


def describe_policy(model, tokenizer) -> dict:
    return {
        "arch": type(model).__name__,
        "parameters": count_parameters(model),
        "vocab_size": len(tokenizer),
        "layers": getattr(model.config, "num_hidden_layers", None),
        "hidden_size": getattr(model.config, "hidden_size", None),
    }


def dumps(d: dict) -> str:
    return json.dumps(d, sort_keys=True)
