"""Where a multi-turn SmolLM2 rollout goes (the engine, W8A8-KV8 executor, vnni backend; 16 episodes x 10 turns x
(120 observation + 20 action tokens), 1 thread): torch profiler op table, and the time of prefill (batch.step's
observation forward) against decode. Run: .venv/bin/python results/bench-2026-12-02-s13/prof_rollout.py [--bf16]"""
import argparse, time
import torch
from torch.profiler import profile, ProfilerActivity
from interq.models.pretrained import load_smollm2
from interq.quant import QuantConfig, make_executor, make_kv_cache
from interq.rollout import RolloutEngine, SamplingParams
from interq.rollout.attention import set_rollout_attention

ap = argparse.ArgumentParser()
ap.add_argument("--bf16", action="store_true")
args = ap.parse_args()
torch.set_num_threads(1)
learner, _ = load_smollm2(torch.bfloat16)
qcfg = QuantConfig()
model = set_rollout_attention(learner if args.bf16 else make_executor(learner, qcfg), "sdpa_packed")
g = torch.Generator().manual_seed(0)
obs = [torch.randint(10, 49000, (16, 120), generator=g) for _ in range(10)]
engine = RolloutEngine(model, cache_factory=None if args.bf16 else (lambda c: make_kv_cache(qcfg, c)),
                       max_context_tokens=100_000)
batch = engine.new_batch(list(range(16)), SamplingParams(temperature=1.0, max_action_tokens=20))
with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as p:
    t0 = time.perf_counter()
    for chunk in obs:
        batch.step({i: chunk[i].tolist() for i in range(16)})
    print(f"rollout wall {time.perf_counter() - t0:.1f} s (profiled)")
print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=30))
# flash attention split by query length: decode (one packed token: [B, H_kv, G, D]) against prefill
split = {"decode": [0.0, 0], "prefill": [0.0, 0]}
for e in p.key_averages(group_by_input_shape=True):
    if e.key == "aten::_scaled_dot_product_flash_attention_for_cpu" and e.input_shapes:
        kind = "decode" if e.input_shapes[0][2] <= 4 else "prefill"
        split[kind][0] += e.self_cpu_time_total / 1e6
        split[kind][1] += e.count
print({k: f"{v[0]:.1f} s in {v[1]} calls" for k, v in split.items()})
