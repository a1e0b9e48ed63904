"""Sixteenth session: where the rollout engine's batch-16 greedy decode goes (SmolLM2-135M, prompts of 40 tokens,
64 new tokens, the bf16 and W8A8-KV8 executors as bench_vllm builds them), by torch.profiler's op table, next to
the executor's own forward time. Usage: prof_engine.py [THREADS]"""
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

from interq.machine import describe, machine_info
from interq.models.pretrained import load_smollm2
from interq.quant import BF16_EXECUTOR, QuantConfig, make_executor, make_kv_cache
from interq.rollout import RolloutEngine, SamplingParams
from interq.rollout.attention import set_rollout_attention

threads = int(sys.argv[1]) if len(sys.argv) > 1 else 2
torch.set_num_threads(threads)
print(describe(machine_info()), flush=True)
learner, _ = load_smollm2(torch.bfloat16)
g = torch.Generator().manual_seed(0)
prompts = [torch.randint(10, 49000, (40,), generator=g).tolist() for _ in range(16)]
qcfg = QuantConfig()
arms = {"bf16": RolloutEngine(set_rollout_attention(make_executor(learner, BF16_EXECUTOR), "sdpa_packed"),
                              max_context_tokens=4096),
        "w8a8_kv8": RolloutEngine(set_rollout_attention(make_executor(learner, qcfg), "sdpa_packed"),
                                  cache_factory=lambda c: make_kv_cache(qcfg, c), max_context_tokens=4096)}


def run(engine, n):
    batch = engine.new_batch(list(range(16)), SamplingParams(temperature=0.0, max_action_tokens=n))
    t = time.perf_counter()
    batch.step({i: p for i, p in enumerate(prompts)})
    dt = time.perf_counter() - t
    batch.close()
    return dt


for name, engine in arms.items():
    run(engine, 4)  # warm-up
    t1, t64 = run(engine, 1), run(engine, 64)
    print(f"\n== {name}: t1 {t1:.3f} s, t64 {t64:.3f} s: {16 * 63 / (t64 - t1):.1f} decode tok/s")
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        run(engine, 64)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=22, max_name_column_width=50))
