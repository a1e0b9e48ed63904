"""Twenty-first session: the lean forward on the comparison study's policy shape (Qwen3, width 64, 4 layers, 4 heads /
2 KV heads of 16, MLP 192, vocabulary 768; random weights), 16 rows, prompts of 120 tokens, two turns of 10 new
tokens (the study's max_action_tokens), one thread as the study's runs: transformers' forward ("off"), the lean
forward ("lean"), with the one-call halves ("fused"), alternating in one process; tokens and log-probs hashed.
Usage: qwen3_ab.py bf16|w8a8kv8|w4a4kv4 [ROUNDS]"""
import sys, time, torch
from transformers import Qwen3Config, Qwen3ForCausalLM
from interq.quant import BF16_EXECUTOR, QuantConfig, make_executor, make_kv_cache
from interq.rollout import RolloutEngine, SamplingParams, fast_layers
from interq.rollout.attention import set_rollout_attention
torch.set_num_threads(1)
torch.manual_seed(0)
learner = Qwen3ForCausalLM(Qwen3Config(vocab_size=768, hidden_size=64, intermediate_size=192, num_hidden_layers=4,
    num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=True, rms_norm_eps=1e-6,
    attn_implementation="sdpa")).to(torch.bfloat16)
qcfg = {"bf16": BF16_EXECUTOR, "w8a8kv8": QuantConfig(),
        "w4a4kv4": QuantConfig(w_bits=4, a_bits=4, kv_bits=4)}[sys.argv[1]]
cache = {"cache_factory": lambda c, q=qcfg: make_kv_cache(q, c)} if qcfg.quantizes_kv else {}
model = set_rollout_attention(make_executor(learner, qcfg), "sdpa_packed")
eng = RolloutEngine(model, max_context_tokens=100_000, **cache)
prompt = torch.randint(10, 760, (16, 120), generator=torch.Generator().manual_seed(0))
MODES = {"off": (False, False), "lean": (True, False), "fused": (True, True)}
def play():
    batch = eng.new_batch(list(range(16)), SamplingParams(temperature=1.0, max_action_tokens=10))
    r1 = batch.step({i: prompt[i].tolist() for i in range(16)})
    r2 = batch.step({i: prompt[i, :40].tolist() for i in range(16)})
    batch.close()
    return [r1, r2]
for mode in MODES.values():
    fast_layers.use_fast_layers(*mode); play()
for rnd in range(int(sys.argv[2]) if len(sys.argv) > 2 else 5):
    for name, mode in MODES.items():
        fast_layers.use_fast_layers(*mode)
        t = time.perf_counter()
        for _ in range(5):
            r = play()
        w = (time.perf_counter() - t) / 5
        key = hash(tuple((tuple(x.action_ids), tuple(x.behavior_logprobs)) for rr in r for x in rr.values()))
        print(f"{name:5s} {w * 1e3:.1f} ms per two-turn batch hash {key}", flush=True)
