"""A/B (the thirteenth session's script, rerun in the fourteenth with the masked prefill kernel): rollout.attention=packed_kernel (decode and masked prefill attention by interq's CPU kernels) against sdpa_packed (the
default) in the rollout engine: SmolLM2-135M, 16 episodes x 10 turns x (120 observation + 20 action tokens), the
W8A8-KV8 and the bf16 executor, rounds interleaved. Then how far the two attentions' log-probs are apart: the W8A8-KV8
executor teacher-forced over the last 64 tokens of each round-0 trajectory (the same prefill, then decode), mean and
max |difference| of the log-probs of the tokens played, beside the W8A8-KV8 vs bf16-learner mismatch (0.20).
Run: .venv/bin/python results/bench-2026-12-02-s14/rollout_attention_ab.py [--threads 1] [--rounds 2]"""
import argparse, copy, json, statistics, time
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
args = ap.parse_args()
torch.set_num_threads(args.threads)
print(describe(machine_info()), flush=True)
learner, _ = load_smollm2(torch.bfloat16)
qcfg = QuantConfig()
exe = make_executor(learner, qcfg)
arms = {"int8 sdpa_packed": (set_rollout_attention(exe, "sdpa_packed"), True),
        "int8 packed_kernel": (set_rollout_attention(copy.deepcopy(exe), "packed_kernel"), True),
        "bf16 sdpa_packed": (set_rollout_attention(learner, "sdpa_packed"), False),
        "bf16 packed_kernel": (set_rollout_attention(copy.deepcopy(learner), "packed_kernel"), False)}
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
    for name in names[r % 4:] + names[:r % 4]:
        wall, cpu, t = rollout(*arms[name])
        res[name].append((wall, cpu))
        toks.setdefault(name, t)
        print(f"round {r} {name}: wall {wall:.1f} s, CPU {cpu:.1f} s", flush=True)
out = {k: {"wall_s": round(statistics.median(x[0] for x in v), 2), "cpu_s": round(statistics.median(x[1] for x in v), 2)}
       for k, v in res.items()}
for kind in ("int8", "bf16"):
    out[f"{kind}_kernel_speedup_wall"] = round(out[f"{kind} sdpa_packed"]["wall_s"] / out[f"{kind} packed_kernel"]["wall_s"], 3)
out["int8_over_bf16_sdpa_packed"] = round(out["bf16 sdpa_packed"]["wall_s"] / out["int8 sdpa_packed"]["wall_s"], 3)
out["int8_over_bf16_packed_kernel"] = round(out["bf16 packed_kernel"]["wall_s"] / out["int8 packed_kernel"]["wall_s"], 3)

# log-prob distance between the two attentions, W8A8-KV8, teacher-forced over the last 64 tokens of each trajectory
seqs = toks["int8 sdpa_packed"]
n = min(len(s) for s in seqs)
ids = torch.stack([s[:n] for s in seqs])  # [E, n]
lp = {}
with torch.inference_mode():
    for name in ("int8 sdpa_packed", "int8 packed_kernel"):
        m = arms[name][0]
        cache = make_kv_cache(qcfg, m.config)
        o = m(input_ids=ids[:, : n - 64], cache=cache, use_cache=True)
        rows = [torch.log_softmax(o.logits[:, -1].float(), -1).gather(1, ids[:, n - 64: n - 63])]
        for t in range(n - 64, n - 1):
            o = m(input_ids=ids[:, t: t + 1], cache=o.cache, use_cache=True)
            rows.append(torch.log_softmax(o.logits[:, -1].float(), -1).gather(1, ids[:, t + 1: t + 2]))
        lp[name] = torch.cat(rows, 1)  # [E, 64]
d = (lp["int8 packed_kernel"] - lp["int8 sdpa_packed"]).abs()
out["logprob_abs_diff_mean"] = round(d.mean().item(), 5)
out["logprob_abs_diff_max"] = round(d.max().item(), 5)
out["context_tokens"] = n
print(out)
m = machine_info(); m["load_avg_end"] = load_avg()
print("RESULT " + json.dumps({"args": vars(args), **out, "machine": m}))
