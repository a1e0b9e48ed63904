"""Twentieth session (copy of the eighteenth's prof_decode.py): where a batch-16 decode goes in the engine (SmolLM2, 32 prompt + 32 new tokens), bf16 and
W8A8-KV8 executors with rollout.attention=sdpa_packed (the default; the eighteenth session's copy used transformers' sdpa), by torch.profiler (ops by self CPU time) after a warm-up. Usage: prof_decode.py [THREADS]"""
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

from interq.machine import describe, machine_info
from interq.models.pretrained import load_smollm2
from interq.quant import BF16_EXECUTOR, QuantConfig, make_executor, make_kv_cache
from interq.rollout import RolloutEngine, SamplingParams
from interq.rollout.attention import set_rollout_attention

torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
print(describe(machine_info()), flush=True)
learner, _ = load_smollm2(torch.bfloat16)
prompt = torch.randint(10, 49000, (16, 32), generator=torch.Generator().manual_seed(0))
for name, qcfg in (("bf16", BF16_EXECUTOR), ("w8a8-kv8", QuantConfig())):
    cache = {"cache_factory": lambda c, q=qcfg: make_kv_cache(q, c)} if qcfg is not BF16_EXECUTOR else {}
    eng = RolloutEngine(set_rollout_attention(make_executor(learner, qcfg), "sdpa_packed"), max_context_tokens=100_000, **cache)

    def decode():
        batch = eng.new_batch(list(range(16)), SamplingParams(temperature=1.0, max_action_tokens=32))
        batch.step({i: prompt[i].tolist() for i in range(16)})
        batch.close()

    decode()
    t = time.perf_counter()
    decode()
    wall = time.perf_counter() - t
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        decode()
    print(f"== {name}: {wall:.2f} s unprofiled ({16 * 32 / wall:.1f} tok/s)")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=40, max_name_column_width=60))
