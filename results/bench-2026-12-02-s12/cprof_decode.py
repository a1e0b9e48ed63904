"""cProfile of SmolLM2 W8A8-KV8 decode steps (batch 16): where the Python side of a step goes.
Run: .venv/bin/python results/bench-2026-12-02-s12/cprof_decode.py [bf16|w8a8]"""
import cProfile, pstats, sys, time
import torch
from interq.models.pretrained import load_smollm2
from interq.quant import QuantConfig, make_executor, BF16_EXECUTOR
from interq.quant.kv_cache import make_kv_cache
from interq.rollout.attention import set_rollout_attention
torch.set_num_threads(2)
arm = sys.argv[1] if len(sys.argv) > 1 else "w8a8"
learner, _ = load_smollm2(torch.bfloat16)
q = QuantConfig() if arm == "w8a8" else BF16_EXECUTOR
m = make_executor(learner, q)
set_rollout_attention(m, "sdpa_packed")
prompt = torch.tensor([list(range(100, 116))] * 16)
def run(steps):
    cache = make_kv_cache(q, m.config)
    out = m(input_ids=prompt, cache=cache, use_cache=True)
    t = out.logits[:, -1].argmax(-1, keepdim=True)
    for _ in range(steps):
        out = m(input_ids=t, cache=out.cache, use_cache=True)
        t = out.logits[:, -1].argmax(-1, keepdim=True)
with torch.inference_mode():
    run(4)
    pr = cProfile.Profile()
    pr.enable(); run(16); pr.disable()
pstats.Stats(pr).sort_stats("tottime").print_stats(30)
