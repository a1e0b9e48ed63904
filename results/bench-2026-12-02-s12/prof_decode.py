"""Where a SmolLM2 decode step (batch 16) goes: int8 W8A8-KV8 vs bf16 executor, torch profiler + wall time.
Run: .venv/bin/python results/bench-2026-12-02-s12/prof_decode.py [--steps 16] [--threads 2]"""
import argparse, statistics, time
import torch
from torch.profiler import profile, ProfilerActivity
from interq.models.pretrained import load_smollm2
from interq.quant import QuantConfig, make_executor
from interq.quant.kv_cache import make_kv_cache
from interq.rollout.attention import set_rollout_attention
from interq.quant.config import BF16_EXECUTOR

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=16)
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--rounds", type=int, default=3)
ap.add_argument("--no-prof", action="store_true")
args = ap.parse_args()
torch.set_num_threads(args.threads)
learner, tok = load_smollm2(torch.bfloat16)
qcfg = QuantConfig()
arms = {"bf16": (make_executor(learner, BF16_EXECUTOR), BF16_EXECUTOR), "w8a8_kv8": (make_executor(learner, qcfg), qcfg)}
for m, _ in arms.values():
    set_rollout_attention(m, "sdpa_packed")
prompt = torch.tensor([list(range(100, 116))] * 16)

def run(model, q, steps):
    cache = make_kv_cache(q, model.config)
    out = model(input_ids=prompt, cache=cache, use_cache=True)
    t = out.logits[:, -1].argmax(-1, keepdim=True)
    t0 = time.perf_counter()
    for _ in range(steps):
        out = model(input_ids=t, cache=out.cache, use_cache=True)
        t = out.logits[:, -1].argmax(-1, keepdim=True)
    return time.perf_counter() - t0

with torch.inference_mode():
    for name, (m, q) in arms.items():
        run(m, q, 4)
    walls = {k: [] for k in arms}
    for _ in range(args.rounds):
        for name, (m, q) in arms.items():
            walls[name].append(run(m, q, args.steps))
    for k, v in walls.items():
        med = statistics.median(v)
        print(f"{k}: {16 * args.steps / med:.1f} tok/s, {1000 * med / args.steps:.2f} ms/step")
    print(f"int8/bf16 {statistics.median(walls['bf16']) / statistics.median(walls['w8a8_kv8']):.3f}")
    if not args.no_prof:
        for name, (m, q) in arms.items():
            with profile(activities=[ProfilerActivity.CPU]) as p:
                w = run(m, q, args.steps)
            tot = sum(e.self_cpu_time_total for e in p.key_averages()) / 1e3
            print(f"== {name}: wall {1000 * w / args.steps:.2f} ms/step (profiled), op self time {tot / args.steps:.2f} ms/step")
            print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
