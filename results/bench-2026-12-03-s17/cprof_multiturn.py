"""Seventeenth session: the Python side of bench_engine's multi-turn episodes (SmolLM2, 16 episodes x 10 turns x
(40 observation + 10 action tokens)) by cProfile, on the bf16 executor's engine or the W8A8-KV8 executor's (its
8-bit KV cache). Usage: cprof_multiturn.py [THREADS] [bf16|w8a8] (cprof_multiturn.log: 2 bf16;
cprof_multiturn_int8.log: 2 w8a8)"""
import cProfile
import pstats
import sys
import time

import torch

from interq.machine import describe, machine_info
from interq.models.pretrained import load_smollm2
from interq.quant import BF16_EXECUTOR, QuantConfig, make_executor, make_kv_cache
from interq.rollout import RolloutEngine, SamplingParams
from interq.rollout.attention import set_rollout_attention

threads = int(sys.argv[1]) if len(sys.argv) > 1 else 2
torch.set_num_threads(threads)
print(describe(machine_info()), flush=True)
learner, _ = load_smollm2(torch.bfloat16)
qcfg = QuantConfig() if len(sys.argv) > 2 and sys.argv[2] == "w8a8" else BF16_EXECUTOR
cache = {"cache_factory": lambda c: make_kv_cache(qcfg, c)} if qcfg is not BF16_EXECUTOR else {}
eng = RolloutEngine(set_rollout_attention(make_executor(learner, qcfg), "sdpa_packed"), max_context_tokens=100_000,
                    **cache)
g = torch.Generator().manual_seed(0)
obs = [torch.randint(10, 49000, (16, 40), generator=g) for _ in range(10)]


def episodes():
    batch = eng.new_batch(list(range(16)), SamplingParams(temperature=1.0, max_action_tokens=10))
    for chunk in obs:
        batch.step({i: chunk[i].tolist() for i in range(16)})
    batch.close()


episodes()
t = time.perf_counter()
episodes()
print(f"multi-turn: {time.perf_counter() - t:.2f} s", flush=True)
pr = cProfile.Profile()
pr.enable()
episodes()
pr.disable()
st = pstats.Stats(pr)
st.sort_stats("tottime").print_stats(40)
st.sort_stats("cumtime").print_stats(60)
