"""Eighteenth session: bench_engine's multi-turn episodes (SmolLM2, 16 x 10 turns x (40 + 10), bf16 executor,
sdpa_packed) in a process of their own, with the AMX-BF16 product on or off for the whole process (the in-process
alternation of engine_amx_ab.py measured no difference where bench_engine's bracket measured one). Prints the
median of ROUNDS episodes after a warm-up. Usage: engine_amx_proc.py on|off [ROUNDS]"""
import sys
import time

import torch

from interq.models.pretrained import load_smollm2
from interq.quant import BF16_EXECUTOR, make_executor
from interq.quant.packed_linear import use_amx_product
from interq.rollout import RolloutEngine, SamplingParams
from interq.rollout.attention import set_rollout_attention

arm, rounds = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 3
use_amx_product(arm == "on")
torch.set_num_threads(2)
eng = RolloutEngine(set_rollout_attention(make_executor(load_smollm2(torch.bfloat16)[0], BF16_EXECUTOR), "sdpa_packed"),
                    max_context_tokens=100_000)
g = torch.Generator().manual_seed(0)
obs = [torch.randint(10, 49000, (16, 40), generator=g) for _ in range(10)]


def episodes():
    batch = eng.new_batch(list(range(16)), SamplingParams(temperature=1.0, max_action_tokens=10))
    for chunk in obs:
        batch.step({i: chunk[i].tolist() for i in range(16)})
    batch.close()


episodes()
times = []
for _ in range(rounds):
    t = time.perf_counter()
    episodes()
    times.append(time.perf_counter() - t)
print(f"amx {arm}: median {sorted(times)[len(times) // 2]:.2f} s ({', '.join(f'{t:.2f}' for t in times)})", flush=True)
