"""Eighteenth session: bench_engine's multi-turn episodes (SmolLM2, 16 episodes x 10 turns x (40 observation + 10
action tokens), bf16 executor, sdpa_packed) on two executors, fused RMSNorms (the default) and eager ones
(fuse_norms=False), interleaved in one process; same tokens? Usage: engine_norm_ab.py [THREADS] [ROUNDS]"""
import sys
import time

import torch

from interq.machine import describe, machine_info
from interq.models.pretrained import load_smollm2
from interq.quant import BF16_EXECUTOR, make_executor
from interq.rollout import RolloutEngine, SamplingParams
from interq.rollout.attention import set_rollout_attention

threads = int(sys.argv[1]) if len(sys.argv) > 1 else 2
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
torch.set_num_threads(threads)
print(describe(machine_info()), flush=True)
learner, _ = load_smollm2(torch.bfloat16)
engines = {arm: RolloutEngine(set_rollout_attention(make_executor(learner, BF16_EXECUTOR, fuse_norms=arm), "sdpa_packed"),
                              max_context_tokens=100_000) for arm in (False, True)}
g = torch.Generator().manual_seed(0)
obs = [torch.randint(10, 49000, (16, 40), generator=g) for _ in range(10)]


def episodes(arm):
    batch = engines[arm].new_batch(list(range(16)), SamplingParams(temperature=1.0, max_action_tokens=10))
    for chunk in obs:
        batch.step({i: chunk[i].tolist() for i in range(16)})
    return [(t.token_ids, t.behavior_logprobs) for t in batch.close()]


out = {arm: episodes(arm) for arm in (False, True)}
same = all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(out[False], out[True]))
print("same tokens and behavior log-probs, fused norms vs eager:", same, flush=True)
times = {False: [], True: []}
for r in range(rounds):
    for arm in ((False, True) if r % 2 == 0 else (True, False)):
        t = time.perf_counter()
        episodes(arm)
        times[arm].append(time.perf_counter() - t)
    print(f"round {r}: eager norms {times[False][-1]:.2f} s, fused {times[True][-1]:.2f} s", flush=True)
med = {a: sorted(v)[len(v) // 2] for a, v in times.items()}
print(f"median of {rounds}: eager {med[False]:.2f} s, fused {med[True]:.2f} s, {med[False] / med[True]:.2f}x")
