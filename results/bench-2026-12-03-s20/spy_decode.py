"""Twentieth session: one decode of 16 SmolLM2 rows in the engine (8 prompt tokens, N new), for py-spy:
  py-spy record --native --format raw -r 200 -o OUT -- .venv/bin/python spy_decode.py int8|bf16 THREADS N
then spy_agg.py OUT (it keeps the samples under line 21 of this file, the timed decode; the figures in
transcribed.log are from a copy without this docstring, where it was line 17: spy_agg.py OUT 17)."""
import sys, time, torch
from interq.models.pretrained import load_smollm2
from interq.quant import BF16_EXECUTOR, QuantConfig, make_executor, make_kv_cache
from interq.rollout import RolloutEngine, SamplingParams
from interq.rollout.attention import set_rollout_attention
torch.set_num_threads(int(sys.argv[2]))
learner, _ = load_smollm2(torch.bfloat16)
qcfg = BF16_EXECUTOR if sys.argv[1] == "bf16" else QuantConfig()
cache = {"cache_factory": lambda c, q=qcfg: make_kv_cache(q, c)} if qcfg is not BF16_EXECUTOR else {}
eng = RolloutEngine(set_rollout_attention(make_executor(learner, qcfg), "sdpa_packed"), max_context_tokens=100_000, **cache)
prompt = torch.randint(10, 49000, (16, 8), generator=torch.Generator().manual_seed(0))
def decode(n):
    batch = eng.new_batch(list(range(16)), SamplingParams(temperature=1.0, max_action_tokens=n))
    batch.step({i: prompt[i].tolist() for i in range(16)})
    batch.close()
decode(8)
t=time.perf_counter(); decode(int(sys.argv[3])); print("wall", time.perf_counter()-t, flush=True)
