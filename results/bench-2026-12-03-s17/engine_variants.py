"""Seventeenth session: bench_engine's multi-turn episodes (SmolLM2 bf16 executor's engine, 16 episodes x 10 turns x
(40 observation + 10 action tokens)) under variants, interleaved rounds, medians. Usage: engine_variants.py [THREADS] [ROUNDS]"""
import copy
import statistics
import sys
import time

import torch

import interq.quant.packed_linear as pl
from interq.machine import describe, machine_info
from interq.models.pretrained import load_smollm2
from interq.quant import BF16_EXECUTOR, make_executor
from interq.rollout import RolloutEngine, SamplingParams
from interq.rollout.attention import set_rollout_attention

threads = int(sys.argv[1]) if len(sys.argv) > 1 else 2
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
torch.set_num_threads(threads)
print(describe(machine_info()), flush=True)
learner, _ = load_smollm2(torch.bfloat16)
base = make_executor(learner, BF16_EXECUTOR)
engines = {
    "sdpa_packed": RolloutEngine(set_rollout_attention(base, "sdpa_packed"), max_context_tokens=100_000),
    "packed_kernel": RolloutEngine(set_rollout_attention(copy.deepcopy(base), "packed_kernel"), max_context_tokens=100_000),
}
g = torch.Generator().manual_seed(0)
obs = [torch.randint(10, 49000, (16, 40), generator=g) for _ in range(10)]


def episodes(eng):
    batch = eng.new_batch(list(range(16)), SamplingParams(temperature=1.0, max_action_tokens=10))
    t = time.perf_counter()
    for chunk in obs:
        batch.step({i: chunk[i].tolist() for i in range(16)})
    s = time.perf_counter() - t
    trajs = batch.close()
    return s, trajs


variants = {"sdpa_packed": ("sdpa_packed", 256), "packed_kernel": ("packed_kernel", 256),
            "sdpa_packed_M1024": ("sdpa_packed", 1024)}
times = {k: [] for k in variants}
ref = {}
for k, (att, m) in variants.items():
    pl.PACKED_MAX_M = m
    episodes(engines[att])
for r in range(rounds):
    order = list(variants)[r % len(variants):] + list(variants)[:r % len(variants)]
    for k in order:
        att, m = variants[k]
        pl.PACKED_MAX_M = m
        s, trajs = episodes(engines[att])
        times[k].append(s)
        toks = torch.stack([t.token_ids for t in trajs])
        if k in ref:
            assert torch.equal(ref[k], toks)
        ref[k] = toks
base_t = statistics.median(times["sdpa_packed"])
for k, v in times.items():
    same = torch.equal(ref[k], ref["sdpa_packed"])
    print(f"{k:20s} median {statistics.median(v):6.2f} s  runs {[round(x, 2) for x in v]}  "
          f"speedup {base_t / statistics.median(v):.3f}  same tokens as sdpa_packed: {same}", flush=True)
