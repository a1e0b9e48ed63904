"""Twentieth session: one layer's KV cache update for a decode step (SmolLM2's shapes: 16 rows, 3 KV heads, head size
64, bf16, after a 40-token prefill), us per call (best of 30 trials of 50 steps), with interq's one-call kv_append
(append_pair) and without it (the eager appends), for transformers' growing cache and the 8-bit cache that keeps
dequantized values. One thread."""
import time

import torch
from transformers import LlamaConfig

from interq.quant import QuantConfig, kernels, make_kv_cache
from interq.quant import kv_cache as KV
from interq.rollout import kv_buffer as KB

torch.set_num_threads(1)
kernels.load()
cfg = LlamaConfig(vocab_size=96, hidden_size=576, intermediate_size=256, num_hidden_layers=1, num_attention_heads=9,
                  num_key_value_heads=3, head_dim=64)
prefill = torch.randn(16, 3, 40, 64).bfloat16()
k = torch.randn(16, 3, 1, 64).bfloat16()
real = KB.append_pair
for rnd in range(2):
    for one_call in (False, True):
        KB.append_pair = KV.append_pair = real if one_call else (lambda *a, **kw: None)
        for name, fac in (("growing", KB.growing_dynamic_cache), ("kv8", lambda c: make_kv_cache(QuantConfig(), c))):
            best = 1e9
            for trial in range(30):
                cache = fac(cfg)
                cache.update(prefill, prefill, 0)
                layer = cache.layers[0]
                t0 = time.perf_counter()
                for _ in range(50):
                    layer.update(k, k)
                best = min(best, (time.perf_counter() - t0) / 50 * 1e6)
            print(f"round {rnd} {name:8s} one_call={one_call}: {best:.1f} us", flush=True)
