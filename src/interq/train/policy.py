"""The policy: a tokenizer trained on environment text and a small Qwen3 / Qwen3-MoE built from a config.

Both are saved in the standard formats (``model.safetensors`` + ``config.json``, ``tokenizer.json`` +
``tokenizer_config.json``) so that :func:`load_policy` reads a tiny policy, SmolLM2-135M-Instruct or any
transformers causal-LM checkpoint directory with the same code.

With a 49k vocabulary ~90% of a tiny model's parameters sit in the embedding; a byte-level
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


class NonFiniteWeightsError(ConfigError):
    """A model's weights hold NaN or infinite values: never saved, never loaded."""


def nonfinite_parameters(model) -> list[str]:
    """Names of the parameters (and buffers) holding a NaN or an infinity."""
    bad = [n for n, p in model.named_parameters() if p.is_floating_point() and not bool(torch.isfinite(p).all())]
    bad += [n for n, b in model.named_buffers() if b.is_floating_point() and not bool(torch.isfinite(b).all())]
    return bad


def _nonfinite_message(bad: list[str]) -> str:
    return f"{len(bad)} tensors hold NaN or infinite values ({', '.join(bad[:3])}{', ...' if len(bad) > 3 else ''})"


def save_policy(model, tokenizer, path: str | Path) -> Path:
    """Write ``model.safetensors`` + ``config.json`` + ``tokenizer.json`` into ``path`` (created). Weights that are
    not all finite are refused (:class:`NonFiniteWeightsError`) before anything is written."""
    path = Path(path)
    bad = nonfinite_parameters(model)
    if bad:
        raise NonFiniteWeightsError(f"{path}: not saved: the weights are not finite: {_nonfinite_message(bad)}")
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    return path


TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")  # any one of them, with tokenizer_config.json


def _safetensors_header(path: Path) -> dict:
    """The tensor table of a safetensors file, checked against the file's length: {name: (dtype, shape)}. Raises
    :class:`ConfigError` for a file that is unreadable, not safetensors, or shorter than its header says."""
    import struct

    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise ConfigError(f"{path}: not a safetensors file ({size} bytes)")
            (n,) = struct.unpack("<Q", head)
            if n > size - 8 or n > 100_000_000:
                raise ConfigError(f"{path}: truncated or not a safetensors file (its header claims {n} bytes; the "
                                  f"file has {size})")
            table = json.loads(f.read(n))
    except OSError as e:
        raise ConfigError(f"{path}: cannot be read ({e.strerror or e})") from None
    except (ValueError, UnicodeDecodeError):
        raise ConfigError(f"{path}: not a safetensors file (its header is not JSON)") from None
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: not a safetensors file (its header is not a table)")
    out, end = {}, 0
    for name, rec in table.items():
        if name == "__metadata__":
            continue
        try:
            out[name] = (rec["dtype"], tuple(int(x) for x in rec["shape"]))
            end = max(end, int(rec["data_offsets"][1]))
        except (KeyError, TypeError, ValueError, IndexError):
            raise ConfigError(f"{path}: not a safetensors file (tensor {name!r} has no dtype, shape or offsets)") from None
    if 8 + n + end > size:
        raise ConfigError(f"{path}: truncated: {size} bytes, its tensors need {8 + n + end} (an interrupted copy or "
                          "save?)")
    return out


def check_policy_dir(source: str | Path, what: str = "policy") -> Path:
    """Check a policy directory before any work: ``config.json`` a transformers config, every tensor the model
    expects present in its safetensors with the right shape (tied embeddings aside), no file truncated, a tokenizer
    there. Raises :class:`ConfigError` with one line naming the file and what is wrong; returns the directory.
    ``source``: a directory or ``"smollm2"``. (Finite weights are checked when they are loaded: :func:`load_policy`.)"""
    if str(source) == "smollm2":
        from interq.models.pretrained import smollm2_dir

        source = smollm2_dir()
    path = Path(source)
    label = f"{what}={str(path)!r}"
    if not path.is_dir():
        raise ConfigError(f"{label}: {'a file, not a directory' if path.exists() else 'no such directory'}")
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise ConfigError(f"{label}: no config.json there; expected a transformers checkpoint directory")
    try:
        raw = json.loads(cfg_file.read_text())
        if not isinstance(raw, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError, UnicodeDecodeError) as e:
        raise ConfigError(f"{cfg_file}: not a valid JSON config ({' '.join(str(e).split())[:120]})") from None
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        mcfg = AutoConfig.from_pretrained(path)
    except Exception as e:  # noqa: BLE001 - whatever transformers raises for an unusable config: one line
        raise ConfigError(f"{cfg_file}: not a usable transformers config ({' '.join(str(e).split())[:160]})") from None
    weights = path / "model.safetensors"
    index = path / "model.safetensors.index.json"
    tables: dict[str, tuple] = {}
    if weights.is_file():
        tables = _safetensors_header(weights)
    elif index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError):
            raise ConfigError(f"{index}: not a valid safetensors index") from None
        for shard in shards:
            if not (path / shard).is_file():
                raise ConfigError(f"{label}: shard {shard} named in {index.name} is missing")
            tables.update(_safetensors_header(path / shard))
    else:
        raise ConfigError(f"{label}: no model.safetensors (nor model.safetensors.index.json) there")
    try:
        with torch.device("meta"):
            skeleton = AutoModelForCausalLM.from_config(mcfg)
    except Exception as e:  # noqa: BLE001
        raise ConfigError(f"{cfg_file}: transformers cannot build a causal LM from it ({' '.join(str(e).split())[:160]})") from None
    expected = {k: tuple(v.shape) for k, v in skeleton.state_dict().items()}
    tied = bool(getattr(mcfg, "tie_word_embeddings", False)) or bool(getattr(mcfg.get_text_config(), "tie_word_embeddings", False))
    missing = [k for k in expected if k not in tables and not (tied and "lm_head" in k)]
    # a tensor transformers stores in another layout (Qwen3-MoE's experts: one tensor per expert on disk, fused in
    # the model) has other names under the same module: left to the load's own report (load_policy)
    missing = [k for k in missing if not any(t.startswith(k.rsplit(".", 1)[0] + ".") for t in tables)]
    if missing:
        raise ConfigError(f"{weights if weights.is_file() else index}: {len(missing)} tensors the model needs are "
                          f"missing ({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}); a damaged or "
                          "foreign policy")
    wrong = [f"{k} {list(tables[k][1])} (expected {list(v)})" for k, v in expected.items()
             if k in tables and tables[k][1] != v]
    if wrong:
        raise ConfigError(f"{weights if weights.is_file() else index}: {len(wrong)} tensors have other shapes than "
                          f"config.json gives ({'; '.join(wrong[:2])}{'; ...' if len(wrong) > 2 else ''}); weights of "
                          "another model")
    extra = [k for k in tables if k not in expected
             and not any(e.startswith(k.rsplit(".", 3)[0] + ".") for e in expected)]  # same converted layouts
    if extra:
        raise ConfigError(f"{weights if weights.is_file() else index}: {len(extra)} tensors the model does not have "
                          f"({', '.join(extra[:3])}{', ...' if len(extra) > 3 else ''}); weights of another model")
    if not any((path / n).is_file() for n in TOKENIZER_FILES):
        raise ConfigError(f"{label}: no tokenizer there (none of {', '.join(TOKENIZER_FILES)})")
    tcfg = path / "tokenizer_config.json"
    if not tcfg.is_file():
        raise ConfigError(f"{label}: no tokenizer_config.json there")
    try:
        json.loads(tcfg.read_text())
        if (path / "tokenizer.json").is_file():
            json.loads((path / "tokenizer.json").read_text())
    except (OSError, ValueError, UnicodeDecodeError) as e:
        raise ConfigError(f"{label}: its tokenizer files are not valid JSON ({' '.join(str(e).split())[:120]})") from None
    return path


def load_policy(source: str | Path, dtype: str = "float32"):
    """(model, tokenizer) from a checkpoint directory, or ``"smollm2"`` for the offline SmolLM2-135M.

    The directory is checked first (:func:`check_policy_dir`), and the loaded weights must all be finite: anything
    else is :class:`ConfigError` with one line naming the file (nothing is re-initialised in silence)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = check_policy_dir(source, "model.source")
    try:
        model, info = AutoModelForCausalLM.from_pretrained(path, dtype=_dtype(dtype), output_loading_info=True)
    except Exception as e:  # noqa: BLE001 - checked above; whatever is left is said in one line
        raise ConfigError(f"policy {path}: the weights cannot be loaded ({' '.join(str(e).split())[:200]})") from None
    missing = [k for k in info.get("missing_keys", ()) if not ("lm_head" in k and getattr(model.config, "tie_word_embeddings", False))]
    if missing or info.get("mismatched_keys"):
        raise ConfigError(f"policy {path}: the weights do not match config.json (missing {missing[:3]}, other shapes "
                          f"{list(info.get('mismatched_keys', ()))[:3]})")
    bad = nonfinite_parameters(model)
    if bad:
        raise NonFiniteWeightsError(f"policy {path}: refused: {_nonfinite_message(bad)}")
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except Exception as e:  # noqa: BLE001
        raise ConfigError(f"policy {path}: the tokenizer cannot be loaded ({' '.join(str(e).split())[:200]})") from None
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
