"""Eighteenth session: bench_engine's multi-turn episodes (SmolLM2, 16 episodes x 10 turns x (40 observation + 10
action tokens), bf16 executor, sdpa_packed) with the AMX-BF16 product on and off, interleaved in one process, and
whether the two give the same tokens. Usage: engine_amx_ab.py [THREADS] [ROUNDS]"""
import sys
import time

import torch

from interq.machine import describe, machine_info
from interq.models.pretrained import load_smollm2
from interq.quant import BF16_EXECUTOR, make_executor
from interq.quant.packed_linear import amx_available, use_amx_product
from interq.rollout import RolloutEngine, SamplingParams
from interq.rollout.attention import set_rollout_attention

threads = int(sys.argv[1]) if len(sys.argv) > 1 else 2
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
torch.set_num_threads(threads)
print(describe(machine_info()), "| amx product:", amx_available(), flush=True)
learner, _ = load_smollm2(torch.bfloat16)
eng = RolloutEngine(set_rollout_attention(make_executor(learner, BF16_EXECUTOR), "sdpa_packed"),
                    max_context_tokens=100_000)
g = torch.Generator().manual_seed(0)
obs = [torch.randint(10, 49000, (16, 40), generator=g) for _ in range(10)]


def episodes():
    batch = eng.new_batch(list(range(16)), SamplingParams(temperature=1.0, max_action_tokens=10))
    for chunk in obs:
        batch.step({i: chunk[i].tolist() for i in range(16)})
    return [(t.token_ids, t.behavior_logprobs) for t in batch.close()]


tokens = {}
for arm in (False, True):  # warm-up: probes, packs, allocator
    use_amx_product(arm)
    tokens[arm] = episodes()
same = all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(tokens[False], tokens[True]))
print("same tokens and behavior log-probs with the AMX product on and off:", same, flush=True)
times = {False: [], True: []}
for r in range(rounds):
    for arm in ((False, True) if r % 2 == 0 else (True, False)):
        use_amx_product(arm)
        t = time.perf_counter()
        episodes()
        times[arm].append(time.perf_counter() - t)
    print(f"round {r}: off {times[False][-1]:.2f} s, amx {times[True][-1]:.2f} s", flush=True)
med = {a: sorted(v)[len(v) // 2] for a, v in times.items()}
print(f"median of {rounds}: off {med[False]:.2f} s, amx {med[True]:.2f} s, {med[False] / med[True]:.2f}x")
