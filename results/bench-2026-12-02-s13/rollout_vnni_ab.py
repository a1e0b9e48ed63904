"""A/B: the W8A8-KV8 executor's int8 GEMMs by the vnni backend (auto here) against torch._int_mm inside the rollout
engine: SmolLM2-135M, long multi-turn episodes (prefill-sized GEMMs go to _int_mm in both arms, decode-sized ones
differ), rounds interleaved, the same trajectories checked; the bf16 executor as the common reference.
Run: .venv/bin/python results/bench-2026-12-02-s13/rollout_vnni_ab.py [--threads 1] [--rounds 2]
(sixteenth session: ``--backends amx,vnni`` compares those two instead; the default is the thirteenth session's pair)"""
import argparse, json, statistics, time
import torch
from interq.machine import describe, machine_info, load_avg
from interq.models.pretrained import load_smollm2
from interq.quant import QuantConfig, make_executor, make_kv_cache
from interq.rollout import RolloutEngine, SamplingParams
from interq.rollout.attention import set_rollout_attention

ap = argparse.ArgumentParser()
ap.add_argument("--threads", type=int, default=1)
ap.add_argument("--rounds", type=int, default=2)
ap.add_argument("--episodes", type=int, default=16)
ap.add_argument("--turns", type=int, default=10)
ap.add_argument("--obs", type=int, default=120)
ap.add_argument("--act", type=int, default=20)
ap.add_argument("--backends", default="vnni,int_mm", help="the two int8 backends compared (A,B)")
args = ap.parse_args()
torch.set_num_threads(args.threads)
print(describe(machine_info()), flush=True)
learner, _ = load_smollm2(torch.bfloat16)
qcfg = QuantConfig()
A, B = args.backends.split(",")
arms = {f"int8 {A}": set_rollout_attention(make_executor(learner, qcfg, int8_backend=A), "sdpa_packed"),
        f"int8 {B}": set_rollout_attention(make_executor(learner, qcfg, int8_backend=B), "sdpa_packed"),
        "bf16": set_rollout_attention(learner, "sdpa_packed")}
g = torch.Generator().manual_seed(0)
obs = [torch.randint(10, 49000, (args.episodes, args.obs), generator=g) for _ in range(args.turns)]

def rollout(model, quantized):
    engine = RolloutEngine(model, cache_factory=(lambda c: make_kv_cache(qcfg, c)) if quantized else None,
                           max_context_tokens=100_000)
    batch = engine.new_batch(list(range(args.episodes)), SamplingParams(temperature=1.0, max_action_tokens=args.act))
    t0, c0 = time.perf_counter(), time.process_time()
    for chunk in obs:
        batch.step({i: chunk[i].tolist() for i in range(args.episodes)})
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return wall, cpu, [t.token_ids for t in batch.close()]

res = {k: [] for k in arms}
toks = {}
names = list(arms)
for r in range(args.rounds):
    for name in names[r % 3:] + names[:r % 3]:
        wall, cpu, t = rollout(arms[name], name != "bf16")
        res[name].append((wall, cpu))
        toks.setdefault(name, t)
        print(f"round {r} {name}: wall {wall:.1f} s, CPU {cpu:.1f} s", flush=True)
out = {k: {"wall_s": round(statistics.median(x[0] for x in v), 2), "cpu_s": round(statistics.median(x[1] for x in v), 2)}
       for k, v in res.items()}
out[f"same_tokens_{A}_{B}"] = all(torch.equal(a, b) for a, b in zip(toks[f"int8 {A}"], toks[f"int8 {B}"]))
out[f"{A}_over_{B}_wall"] = round(out[f"int8 {B}"]["wall_s"] / out[f"int8 {A}"]["wall_s"], 3)
out[f"{A}_over_bf16_wall"] = round(out["bf16"]["wall_s"] / out[f"int8 {A}"]["wall_s"], 3)
out[f"{B}_over_bf16_wall"] = round(out["bf16"]["wall_s"] / out[f"int8 {B}"]["wall_s"], 3)
print({k: v for k, v in out.items()})
m = machine_info(); m["load_avg_end"] = load_avg()
print("RESULT " + json.dumps({"args": vars(args), **out, "machine": m}))
