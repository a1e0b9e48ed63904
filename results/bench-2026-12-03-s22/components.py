import collections, sys, time, torch
from interq.models.pretrained import load_smollm2
from interq.quant import BF16_EXECUTOR, QuantConfig, make_executor, make_kv_cache, kernels
from interq.rollout import RolloutEngine, SamplingParams
from interq.rollout.attention import set_rollout_attention
torch.set_num_threads(int(sys.argv[2]))
learner, _ = load_smollm2(torch.bfloat16)
arm = sys.argv[1]
qcfg = BF16_EXECUTOR if arm == "bf16" else QuantConfig()
cache = {"cache_factory": lambda c, q=qcfg: make_kv_cache(q, c)} if qcfg is not BF16_EXECUTOR else {}
model = set_rollout_attention(make_executor(learner, qcfg), "sdpa_packed")
eng = RolloutEngine(model, max_context_tokens=100_000, **cache)
T = collections.Counter(); C = collections.Counter()
mod = kernels.get()
for name in dir(mod):
    if name.startswith("_") or name.startswith("has_"): continue
    fn = getattr(mod, name)
    if not callable(fn): continue
    def wrap(fn=fn, name=name):
        def f(*a, **k):
            t = time.perf_counter()
            try: return fn(*a, **k)
            finally: T[name] += time.perf_counter() - t; C[name] += 1
        return f
    setattr(mod, name, wrap())
prompt = torch.randint(10, 49000, (16, 8), generator=torch.Generator().manual_seed(0))
def decode(n):
    batch = eng.new_batch(list(range(16)), SamplingParams(temperature=1.0, max_action_tokens=n))
    batch.step({i: prompt[i].tolist() for i in range(16)})
    batch.close()
decode(8); T.clear(); C.clear()
n = 24
t0 = time.perf_counter(); decode(n); wall = time.perf_counter() - t0
print(f"{arm}: {wall / n * 1e3:.1f} ms per step")
for k, v in sorted(T.items(), key=lambda kv: -kv[1]):
    print(f"  {k:24s} {v / n * 1e3:6.2f} ms  {C[k] / n:5.0f} calls/step")
print(f"  rest {(wall - sum(T.values())) / n * 1e3:.2f} ms")
