import sys, time, torch
sys.path.insert(0, "benchmarks")
from bench_engine import engine_decode, random_tokens
from interq.models.pretrained import load_smollm2
from interq.quant import BF16_EXECUTOR, QuantConfig, make_executor, make_kv_cache
from interq.rollout import RolloutEngine
from interq.rollout.attention import set_rollout_attention
torch.set_num_threads(2)
learner, _ = load_smollm2(torch.bfloat16)
prompt = random_tokens(16, 32, 49152, 0)
def raw(exe, q, n):
    with torch.inference_mode():
        cache = make_kv_cache(q, exe.config)
        out = exe(input_ids=prompt, cache=cache, use_cache=True)
        t = out.logits[:, -1].argmax(-1, keepdim=True)
        for _ in range(n - 1):
            out = exe(input_ids=t, cache=out.cache, use_cache=True)
            t = out.logits[:, -1].argmax(-1, keepdim=True)
arms = {}
for name, q in (("bf16", BF16_EXECUTOR), ("w8a8_kv8", QuantConfig())):
    exe = set_rollout_attention(make_executor(learner, q), "sdpa_packed")
    eng = RolloutEngine(exe, cache_factory=lambda c, q=q: make_kv_cache(q, c), max_context_tokens=100_000)
    arms[name] = (exe, q, eng)
    engine_decode(eng, prompt, 8); raw(exe, q, 8)
res = {k: {"engine": [], "raw": []} for k in arms}
for r in range(3):
    for name, (exe, q, eng) in arms.items():
        c = time.process_time(); engine_decode(eng, prompt, 32); res[name]["engine"].append(time.process_time() - c)
        c = time.process_time(); raw(exe, q, 32); res[name]["raw"].append(time.process_time() - c)
for name in res:
    print(name, {k: sorted(v)[1] for k, v in res[name].items()})
print("int8/bf16 engine", sorted(res["bf16"]["engine"])[1] / sorted(res["w8a8_kv8"]["engine"])[1],
      "raw", sorted(res["bf16"]["raw"])[1] / sorted(res["w8a8_kv8"]["raw"])[1])
