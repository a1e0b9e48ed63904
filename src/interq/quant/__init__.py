"""interq.quant: the W8A8-KV8 executor, its 8-bit KV cache, weight sync and the aligned learner forward.

Described in docs/executor.md. Usage::

    import torch
    from interq.quant import QuantConfig, make_executor, make_kv_cache, sync_weights, aligned

    qcfg = QuantConfig()                                  # W8A8 int8 per-channel sym127, int8 per-token-head KV
    # QuantConfig(w_bits=4, a_bits=4, kv_bits=4): narrower integer codes, same kernels (W4A4-KV4)
    executor = make_executor(learner, qcfg)               # a new module; learner untouched (q|k|v, gate|up fused)
    cache = make_kv_cache(qcfg, executor.config)          # quantizes each token's K/V once, when written
    out = executor(input_ids=prompt, cache=cache, use_cache=True)          # prefill   [B, L, V]
    out = executor(input_ids=next_tok, cache=out.cache, use_cache=True)    # one decode step
    logp = torch.log_softmax(out.logits.float(), -1)      # log-softmax in fp32
    cache.batch_select_indices(torch.tensor([0, 2]))      # drop finished sessions
    ...
    seconds = sync_weights(learner, executor)             # after every optimizer step
    with aligned(learner, qcfg):                          # learner forward with the same fake quant + STE
        logits = learner(input_ids=ids).logits

(``past_key_values=`` is the older name of ``cache=`` in transformers 5.x: an executor moves either to the name its
forward takes, and the rollout engine passes the cache under that name, :mod:`interq._hf`.)
"""

from interq.quant.aligned import aligned, clear_aligned_cache
from interq.quant.config import BF16_EXECUTOR, QuantConfig
from interq.quant.executor import make_executor, quantized_targets, sync_weights
from interq.quant.kv_cache import QuantKVCache, QuantKVLayer, kv_bytes_per_token, make_kv_cache
from interq.quant.linear import (FusedQuantLinear, FusedQuantSlice, QuantExperts, QuantLinear, fp8_linear,
                                 int8_linear, int_mm_padded)
from interq.quant.primitives import (
    E4M3_MAX,
    dequant_kv,
    dequant_weight,
    fake_quant_activation,
    fake_quant_kv,
    fake_quant_weight,
    fp8_cast,
    fq_activation_ste,
    fq_kv_ste,
    fq_weight_ste,
    quant_act_fp8_group,
    quant_act_fp8_token,
    quant_act_int8_token,
    quant_kv,
    quant_weight,
    quant_weight_fp8,
    quant_weight_int8,
    round_half_away,
    ste,
)

__all__ = [
    "BF16_EXECUTOR", "E4M3_MAX", "FusedQuantLinear", "FusedQuantSlice", "QuantConfig", "QuantExperts", "QuantKVCache",
    "QuantKVLayer", "QuantLinear", "aligned", "clear_aligned_cache", "dequant_kv", "dequant_weight",
    "fake_quant_activation", "fake_quant_kv", "fake_quant_weight", "fp8_cast", "fp8_linear", "fq_activation_ste",
    "fq_kv_ste", "fq_weight_ste", "int8_linear", "int_mm_padded", "kv_bytes_per_token", "make_executor",
    "make_kv_cache", "quant_act_fp8_group", "quant_act_fp8_token", "quant_act_int8_token", "quant_kv", "quant_weight",
    "quant_weight_fp8", "quant_weight_int8", "quantized_targets", "round_half_away", "ste", "sync_weights",
]
