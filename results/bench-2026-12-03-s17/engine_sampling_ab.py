"""Seventeenth session: bench_engine's multi-turn episodes (SmolLM2 bf16 executor's engine, sdpa_packed, 16 episodes x
10 turns x (40 observation + 10 action tokens), temperature 1) with the sampler's uniforms from interq's kernel and
from torch's uniform_ in Python threads (kernels.set_enabled toggles only that here: the bf16 engine runs no other
kernel), interleaved rounds in one process, medians; the same tokens checked. With a third argument ``only`` each
process times one path (the first argument of rounds alternate between processes: see engine_sampling_ab.sh).
Usage: engine_sampling_ab.py [THREADS] [ROUNDS] [threads|kernel]"""
import statistics
import sys
import time

import torch

from interq.machine import describe, machine_info
from interq.models.pretrained import load_smollm2
from interq.quant import BF16_EXECUTOR, kernels, make_executor
from interq.rollout import RolloutEngine, SamplingParams
from interq.rollout.attention import set_rollout_attention

threads = int(sys.argv[1]) if len(sys.argv) > 1 else 2
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
torch.set_num_threads(threads)
kernels.load()
print(describe(machine_info()), flush=True)
learner, _ = load_smollm2(torch.bfloat16)
eng = RolloutEngine(set_rollout_attention(make_executor(learner, BF16_EXECUTOR), "sdpa_packed"), max_context_tokens=100_000)
g = torch.Generator().manual_seed(0)
obs = [torch.randint(10, 49000, (16, 40), generator=g) for _ in range(10)]


def episodes():
    batch = eng.new_batch(list(range(16)), SamplingParams(temperature=1.0, max_action_tokens=10))
    t = time.perf_counter()
    for chunk in obs:
        batch.step({i: chunk[i].tolist() for i in range(16)})
    s = time.perf_counter() - t
    return s, torch.stack([tr.token_ids for tr in batch.close()])


episodes()
only = sys.argv[3] if len(sys.argv) > 3 else None
times, toks = {"threads": [], "kernel": []}, {}
for r in range(rounds):
    for path in ((only,) if only else ("threads", "kernel") if r % 2 == 0 else ("kernel", "threads")):
        kernels.set_enabled(path == "kernel")
        s, toks[path] = episodes()
        times[path].append(s)
kernels.set_enabled(True)
if only:
    print(f"{only}: median {statistics.median(times[only]):.2f} s {[round(x, 2) for x in times[only]]}; tokens "
          f"checksum {int(toks[only].sum())}")
    sys.exit(0)
t, k = statistics.median(times["threads"]), statistics.median(times["kernel"])
ratios = [a / b for a, b in zip(times["threads"], times["kernel"])]
print(f"threads: median {t:.2f} s {[round(x, 2) for x in times['threads']]}")
print(f"kernel:  median {k:.2f} s {[round(x, 2) for x in times['kernel']]}")
print(f"speedup {t / k:.3f} (paired median {statistics.median(ratios):.3f}); same tokens: {torch.equal(toks['threads'], toks['kernel'])}")
