"""Twenty-first session: the rollout's decoder layers three ways in one process, alternating: transformers' forward
("off"), the lean forward calling each kernel from Python ("lean"), and the lean forward with the kernels' one-call
halves ("fused"). SmolLM2 (or a tiny 30-layer Llama), 16 rows, two turns of N new tokens; tokens and log-probs hashed.
Usage: fused_ab.py int8|bf16 THREADS N smol|tiny [ROUNDS]"""
import json, sys, time, torch
from interq.machine import machine_info
from interq.quant import BF16_EXECUTOR, QuantConfig, make_executor, make_kv_cache
from interq.rollout import RolloutEngine, SamplingParams, fast_layers
from interq.rollout.attention import set_rollout_attention
torch.set_num_threads(int(sys.argv[2]))
if sys.argv[4] == "tiny":
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    learner = LlamaForCausalLM(LlamaConfig(vocab_size=49152, hidden_size=128, intermediate_size=256, num_hidden_layers=30,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, tie_word_embeddings=True, attn_implementation="sdpa")).to(torch.bfloat16)
else:
    from interq.models.pretrained import load_smollm2
    learner, _ = load_smollm2(torch.bfloat16)
qcfg = BF16_EXECUTOR if sys.argv[1] == "bf16" else QuantConfig()
cache = {"cache_factory": lambda c, q=qcfg: make_kv_cache(q, c)} if qcfg is not BF16_EXECUTOR else {}
model = set_rollout_attention(make_executor(learner, qcfg), "sdpa_packed")
eng = RolloutEngine(model, max_context_tokens=100_000, **cache)
prompt = torch.randint(10, 49000, (16, 32), generator=torch.Generator().manual_seed(0))
info = machine_info()
print(json.dumps({k: info.get(k) for k in ("cpu", "cpu_class", "native_bf16", "threads", "load_avg_start", "int8_backend_auto")}), flush=True)
MODES = {"off": (False, False), "lean": (True, False), "fused": (True, True)}
def decode(n):
    batch = eng.new_batch(list(range(16)), SamplingParams(temperature=1.0, max_action_tokens=n))
    res = batch.step({i: prompt[i].tolist() for i in range(16)})
    res2 = batch.step({i: [5, 6, 7] for i in range(16)})
    batch.close()
    return [res, res2]
for mode in MODES.values():
    fast_layers.use_fast_layers(*mode); decode(8)
n, rounds = int(sys.argv[3]), int(sys.argv[5]) if len(sys.argv) > 5 else 3
for rnd in range(rounds):
    for name, mode in MODES.items():
        fast_layers.use_fast_layers(*mode)
        t = time.perf_counter(); r = decode(n); w = time.perf_counter() - t
        key = hash(tuple((tuple(x.action_ids), tuple(x.behavior_logprobs)) for rr in r for x in rr.values()))
        print(f"{name:5s} {w:.3f} s {2*16*n/w:.1f} tok/s hash {key}", flush=True)
