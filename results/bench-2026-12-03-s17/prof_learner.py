"""Seventeenth session: where the learner's time goes on the Intel Xeon with AMX (70% of the RL step there): one
micro-batch of the RL step's learner as bench_learner times it (SmolLM2, fp32 master weights, aligned, the defaults
this CPU resolves: train.learner_autocast=bf16_backward, train.learner_attention=kernel), 1 row of 10 turns x
(96 observation + 8 action tokens), forward + PPO loss + backward, torch.profiler's op table. Usage:
prof_learner.py [THREADS]"""
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, "benchmarks")
from bench_learner import learner_pass, make_rows  # noqa: E402

from interq.machine import describe, machine_info  # noqa: E402
from interq.models.pretrained import load_smollm2  # noqa: E402
from interq.quant import QuantConfig, kernels  # noqa: E402

threads = int(sys.argv[1]) if len(sys.argv) > 1 else 1
torch.set_num_threads(threads)
kernels.load()
print(describe(machine_info()), flush=True)
model, _ = load_smollm2(torch.float32)
model.train()
ids, mask, act = make_rows(model.config.vocab_size, 1, 10, 96, 8)
qcfg = QuantConfig()


def one():
    model.zero_grad(set_to_none=True)
    learner_pass(model, ids, mask, act, True, qcfg, "bf16_backward", attention="kernel")


one()
t = time.perf_counter()
one()
print(f"one pass (unprofiled): {time.perf_counter() - t:.2f} s for {int(mask.sum())} tokens", flush=True)
with profile(activities=[ProfilerActivity.CPU]) as prof:
    one()
print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30, max_name_column_width=60))
