"""A/B: the rollout engine's KV cache appending in place (interq.rollout.kv_buffer, the default) against transformers'
concatenation, SmolLM2-135M bf16 and W8A8-KV8 executors, long multi-turn episodes. Same trajectories checked.
Run: .venv/bin/python results/bench-2026-12-02-s12/kv_append_ab.py [--threads 2] [--rounds 2]"""
import argparse, json, statistics, time
import torch
from transformers import DynamicCache
from interq.machine import describe, machine_info, load_avg
from interq.models.pretrained import load_smollm2
from interq.quant import QuantConfig, make_executor, make_kv_cache
from interq.quant import kv_cache as KV
from interq.rollout import RolloutEngine, SamplingParams
from interq.rollout.attention import set_rollout_attention
from interq.rollout.kv_buffer import append_columns

ap = argparse.ArgumentParser()
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--rounds", type=int, default=2)
ap.add_argument("--episodes", type=int, default=16)
ap.add_argument("--turns", type=int, default=10)
ap.add_argument("--obs", type=int, default=120)
ap.add_argument("--act", type=int, default=20)
args = ap.parse_args()
torch.set_num_threads(args.threads)
print(describe(machine_info()), flush=True)
learner, _ = load_smollm2(torch.bfloat16)
bf16 = set_rollout_attention(learner, "sdpa_packed")
qcfg = QuantConfig()
int8 = set_rollout_attention(make_executor(learner, qcfg), "sdpa_packed")
g = torch.Generator().manual_seed(0)
obs = [torch.randint(10, 49000, (args.episodes, args.obs), generator=g) for _ in range(args.turns)]

def cat_columns(cur, new, buffers, name):
    return new.clone() if cur is None or cur.numel() == 0 else torch.cat([cur, new], dim=-2)

def rollout(model, factory, patch):
    KV.append_columns = cat_columns if patch else append_columns
    engine = RolloutEngine(model, cache_factory=factory, max_context_tokens=100_000)
    batch = engine.new_batch(list(range(args.episodes)), SamplingParams(temperature=1.0, max_action_tokens=args.act))
    t0, c0 = time.perf_counter(), time.process_time()
    for chunk in obs:
        batch.step({i: chunk[i].tolist() for i in range(args.episodes)})
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    trajs = batch.close()
    KV.append_columns = append_columns
    return wall, cpu, [t.token_ids for t in trajs]

arms = {"bf16 in place": (bf16, None, False), "bf16 concatenate": (bf16, lambda c: DynamicCache(config=c), False),
        "int8 in place": (int8, lambda c: make_kv_cache(qcfg, c), False),
        "int8 concatenate": (int8, lambda c: make_kv_cache(qcfg, c), True)}
res = {k: [] for k in arms}
toks = {}
names = list(arms)
for r in range(args.rounds):
    for name in names[r % 4:] + names[:r % 4]:
        wall, cpu, t = rollout(*arms[name])
        res[name].append((wall, cpu))
        toks.setdefault(name, t)
        print(f"round {r} {name}: wall {wall:.1f} s, CPU {cpu:.1f} s", flush=True)
same = {k: all(torch.equal(a, b) for a, b in zip(toks[f"{k} in place"], toks[f"{k} concatenate"])) for k in ("bf16", "int8")}
out = {}
for k in ("bf16", "int8"):
    a, b = res[f"{k} in place"], res[f"{k} concatenate"]
    out[k] = {"in_place_wall_s": statistics.median(x[0] for x in a), "concatenate_wall_s": statistics.median(x[0] for x in b),
              "in_place_cpu_s": statistics.median(x[1] for x in a), "concatenate_cpu_s": statistics.median(x[1] for x in b),
              "same_tokens": same[k]}
    out[k]["speedup_wall"] = round(out[k]["concatenate_wall_s"] / out[k]["in_place_wall_s"], 3)
    out[k]["speedup_cpu"] = round(out[k]["concatenate_cpu_s"] / out[k]["in_place_cpu_s"], 3)
    print(f"{k}: in place {out[k]['in_place_wall_s']:.1f} s, concatenate {out[k]['concatenate_wall_s']:.1f} s wall "
          f"({out[k]['speedup_wall']}x; CPU {out[k]['speedup_cpu']}x), same tokens {same[k]}")
m = machine_info(); m["load_avg_end"] = load_avg()
print("RESULT " + json.dumps({"args": vars(args), **out, "machine": m}))
