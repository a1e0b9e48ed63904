"""Twenty-third session (a copy of the twenty-first's, with the attention as a second argument: sdpa_packed or packed_kernel): where a rollout like the SmolLM2 RL step's goes (scripts/rlstep.sh: 8 episodes x 10 turns,
concatenated layout, one thread): here 8 rows, 10 turns of a 280-token observation prefilled over the cache, then 23
sampled tokens, one thread, by timers wrapped around the layers' one-call halves, the linears' module forwards, the
attention functions, the KV cache updates, lm_head and the sampler. Usage: rl_rollout_components.py int8|bf16 [sdpa_packed|packed_kernel]"""
import collections, sys, time, torch
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from interq.models.pretrained import load_smollm2
from interq.quant import BF16_EXECUTOR, QuantConfig, make_executor, make_kv_cache, kernels
from interq.quant import linear as QL, packed_linear as PL, rms_norm as RN, kv_cache as KC
from interq.rollout import RolloutEngine, SamplingParams, engine as E, sampling as S, kv_buffer as KB
from interq.rollout import attention as A
from interq.rollout.attention import set_rollout_attention
torch.set_num_threads(1)
T, N = collections.Counter(), collections.Counter()
def timed(name, fn):
    def f(*a, **k):
        t = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            T[name] += time.perf_counter() - t; N[name] += 1
    return f
PL.PackedBf16Linear.forward = timed("bf16 linear module (prefill > 256 rows: F.linear)", PL.PackedBf16Linear.forward)
QL.FusedQuantLinear.forward = timed("int8 group module", QL.FusedQuantLinear.forward)
QL.QuantLinear.forward = timed("int8 linear module", QL.QuantLinear.forward)
RN.FusedRMSNorm.forward = timed("norm module", RN.FusedRMSNorm.forward)
KC.QuantKVLayer.update = timed("kv update", KC.QuantKVLayer.update)
KB.GrowingLayer.update = timed("kv update", KB.GrowingLayer.update)
learner, _ = load_smollm2(torch.bfloat16)
ATT = sys.argv[2] if len(sys.argv) > 2 else "sdpa_packed"
qcfg = BF16_EXECUTOR if sys.argv[1] == "bf16" else QuantConfig()
cache = {"cache_factory": lambda c, q=qcfg: make_kv_cache(q, c)} if qcfg is not BF16_EXECUTOR else {}
model = set_rollout_attention(make_executor(learner, qcfg), ATT)
mod = kernels.get()
mod.layer_attn_in = timed("layer_in (norm, qkv, rope)", mod.layer_attn_in)
mod.layer_attn_out = timed("layer_out (o, norm, mlp)", mod.layer_attn_out)
A._flash_decode = timed("flash decode", A._flash_decode)
ALL_ATTENTION_FUNCTIONS[A._NAMES[ATT]] = timed("attention function (all calls but flash decode)", ALL_ATTENTION_FUNCTIONS[A._NAMES[ATT]])
model.lm_head.forward = timed("lm_head", model.lm_head.forward)
E.sample_tokens = timed("sampler", S.sample_tokens)
eng = RolloutEngine(model, max_context_tokens=100_000, **cache)
gen = torch.Generator().manual_seed(0)
obs = [[torch.randint(10, 49000, (280,), generator=gen).tolist() for _ in range(8)] for _ in range(10)]
def rollout():
    batch = eng.new_batch(list(range(8)), SamplingParams(temperature=1.0, max_action_tokens=23))
    for turn in range(10):
        batch.step({i: obs[turn][i] for i in range(8)})
    batch.close()
rollout()
T.clear(); N.clear()
t0 = time.perf_counter(); rollout(); wall = time.perf_counter() - t0
print(f"{sys.argv[1]} {ATT}: one rollout of 8 x 10 turns (280-token observations, 23 new tokens a turn): {wall:.2f} s")
for k, v in sorted(T.items(), key=lambda kv: -kv[1]):
    print(f"  {k:52s} {v:7.2f} s  {100 * v / wall:5.1f}%  ({N[k]} calls)")
print(f"  {'rest (python, masks, engine, the timers)':52s} {wall - sum(T.values()):7.2f} s")
