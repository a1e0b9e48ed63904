"""Twenty-first session: where a 16-row SmolLM2 decode step's time goes, per executor and thread count: wall time
of the layers' one-call halves, the flash decode, the KV cache updates, lm_head, the sampler, and the rest (Python,
masks, engine), by wrapping those calls with timers in one process. Usage: components.py int8|bf16 THREADS N"""
import collections, sys, time, torch
from interq.models.pretrained import load_smollm2
from interq.quant import BF16_EXECUTOR, QuantConfig, make_executor, make_kv_cache
from interq.rollout import RolloutEngine, SamplingParams, engine as E, sampling as S
from interq.rollout import attention as A
from interq.quant import kernels
from interq.rollout.attention import set_rollout_attention
torch.set_num_threads(int(sys.argv[2]))
learner, _ = load_smollm2(torch.bfloat16)
qcfg = BF16_EXECUTOR if sys.argv[1] == "bf16" else QuantConfig()
cache = {"cache_factory": lambda c, q=qcfg: make_kv_cache(q, c)} if qcfg is not BF16_EXECUTOR else {}
model = set_rollout_attention(make_executor(learner, qcfg), "sdpa_packed")
eng = RolloutEngine(model, max_context_tokens=100_000, **cache)
T = collections.Counter()
def timed(name, fn):
    def f(*a, **k):
        t = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            T[name] += time.perf_counter() - t
    return f
mod = kernels.get()
mod.layer_attn_in = timed("layer_in (norm, qkv, rope)", mod.layer_attn_in)
mod.layer_attn_out = timed("layer_out (o, norm, mlp)", mod.layer_attn_out)
A._flash_decode = timed("flash decode", A._flash_decode)
head = model.lm_head
head.forward = timed("lm_head", head.forward)
import interq.rollout.kv_buffer as KB, interq.quant.kv_cache as KC
KB.append_pair = KC.append_pair = timed("kv append", KB.append_pair)
E.sample_tokens = timed("sampler", S.sample_tokens)
prompt = torch.randint(10, 49000, (16, 8), generator=torch.Generator().manual_seed(0))
def decode(n):
    batch = eng.new_batch(list(range(16)), SamplingParams(temperature=1.0, max_action_tokens=n))
    batch.step({i: prompt[i].tolist() for i in range(16)})
    batch.close()
decode(8)
T.clear()
n = int(sys.argv[3])
t0 = time.perf_counter(); decode(n); wall = time.perf_counter() - t0
print(f"{sys.argv[1]} threads {sys.argv[2]}: {wall / n * 1e3:.1f} ms per step ({n} steps, 8-token prefill included)")
for k, v in sorted(T.items(), key=lambda kv: -kv[1]):
    print(f"  {k:28s} {v / n * 1e3:6.2f} ms  {100 * v / wall:5.1f}%")
rest = wall - sum(T.values())
print(f"  {'rest (python, masks, engine)':28s} {rest / n * 1e3:6.2f} ms  {100 * rest / wall:5.1f}%")
