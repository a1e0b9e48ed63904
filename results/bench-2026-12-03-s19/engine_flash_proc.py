"""Nineteenth session: bench_engine's multi-turn episodes (SmolLM2, 16 x 10 turns x (40 + 10), sdpa_packed) in a
process of their own, bf16 or W8A8-KV8 executor, with the one-call flash decode on or off for the whole process
(INTERQ_FLASH_DECODE, read at import). Prints the median of ROUNDS episodes after a warm-up, and checks the
trajectories' tokens and behavior log-probs against a file written by the first run of the same executor.
Usage: INTERQ_FLASH_DECODE=0|1 engine_flash_proc.py bf16|w8a8 [ROUNDS]"""
import hashlib
import os
import sys
import time
from pathlib import Path

import torch

from interq.models.pretrained import load_smollm2
from interq.quant import BF16_EXECUTOR, QuantConfig, make_executor, make_kv_cache
from interq.rollout import RolloutEngine, SamplingParams
from interq.rollout.attention import set_rollout_attention

executor, rounds = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 3
qcfg = BF16_EXECUTOR if executor == "bf16" else QuantConfig()
torch.set_num_threads(2)
cache = {} if executor == "bf16" else {"cache_factory": lambda c: make_kv_cache(qcfg, c)}
eng = RolloutEngine(set_rollout_attention(make_executor(load_smollm2(torch.bfloat16)[0], qcfg), "sdpa_packed"),
                    max_context_tokens=100_000, **cache)
g = torch.Generator().manual_seed(0)
obs = [torch.randint(10, 49000, (16, 40), generator=g) for _ in range(10)]


def episodes():
    batch = eng.new_batch(list(range(16)), SamplingParams(temperature=1.0, max_action_tokens=10))
    for chunk in obs:
        batch.step({i: chunk[i].tolist() for i in range(16)})
    return batch.close()


trajs = episodes()
h = hashlib.sha256()
for t in trajs:
    h.update(t.token_ids.numpy().tobytes())
    h.update(t.behavior_logprobs.numpy().tobytes())
digest = h.hexdigest()[:16]
ref = Path(f"/tmp/engine_flash_{executor}.digest")
same = ref.read_text() == digest if ref.exists() else None
if not ref.exists():
    ref.write_text(digest)
times = []
for _ in range(rounds):
    t = time.perf_counter()
    episodes()
    times.append(time.perf_counter() - t)
arm = os.environ.get("INTERQ_FLASH_DECODE", "1")
print(f"{executor} flash {arm}: median {sorted(times)[len(times) // 2]:.2f} s ({', '.join(f'{t:.2f}' for t in times)}); "
      f"trajectories {digest} ({'same as the first run' if same else 'first run' if same is None else 'DIFFERENT'})",
      flush=True)
