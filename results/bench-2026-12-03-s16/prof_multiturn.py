"""Sixteenth session: where bench_engine's multi-turn episodes go on the Intel Xeon with AMX (the target 3x over
generate is not met there): the bf16 executor's engine, 16 episodes x 10 turns x (40 observation + 10 action
tokens), sampling at temperature 1, by torch.profiler's op table (the observation prefills and the decode steps in
separate totals through record_function). Usage: prof_multiturn.py [THREADS]"""
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from interq.machine import describe, machine_info
from interq.models.pretrained import load_smollm2
from interq.quant import BF16_EXECUTOR, make_executor
from interq.rollout import RolloutEngine, SamplingParams, engine as engine_mod
from interq.rollout.attention import set_rollout_attention

threads = int(sys.argv[1]) if len(sys.argv) > 1 else 2
torch.set_num_threads(threads)
print(describe(machine_info()), flush=True)
learner, _ = load_smollm2(torch.bfloat16)
eng = RolloutEngine(set_rollout_attention(make_executor(learner, BF16_EXECUTOR), "sdpa_packed"),
                    max_context_tokens=100_000)
g = torch.Generator().manual_seed(0)
obs = [torch.randint(10, 49000, (16, 40), generator=g) for _ in range(10)]
plain = engine_mod.forward_step


def labelled(model, cache, input_ids, *a, **k):  # prefill (several new tokens) vs decode (one)
    with record_function("prefill_step" if input_ids.shape[1] > 1 else "decode_step"):
        return plain(model, cache, input_ids, *a, **k)


engine_mod.forward_step = labelled


def episodes():
    batch = eng.new_batch(list(range(16)), SamplingParams(temperature=1.0, max_action_tokens=10))
    for chunk in obs:
        batch.step({i: chunk[i].tolist() for i in range(16)})
    batch.close()


episodes()  # warm-up
t = time.perf_counter()
episodes()
print(f"multi-turn (unprofiled): {time.perf_counter() - t:.2f} s", flush=True)
with profile(activities=[ProfilerActivity.CPU]) as prof:
    episodes()
print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=25, max_name_column_width=50))
