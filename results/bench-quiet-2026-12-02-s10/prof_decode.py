"""Profile one SmolLM2 decode stretch (batch 16) of the bf16 and W8A8-KV8 executors with the version-2 defaults."""
import torch
from torch.profiler import ProfilerActivity, profile

from interq.models.pretrained import load_smollm2
from interq.quant import BF16_EXECUTOR, QuantConfig, make_executor, make_kv_cache
from interq.rollout.attention import set_rollout_attention

torch.set_num_threads(2)
learner, tok = load_smollm2(torch.bfloat16)
prompt = torch.randint(100, 40000, (16, 64), generator=torch.Generator().manual_seed(0))
for name, qcfg in (("bf16", BF16_EXECUTOR), ("w8a8_kv8", QuantConfig())):
    exe = set_rollout_attention(make_executor(learner, qcfg), "sdpa_packed")
    with torch.no_grad():
        for warm in (True, False):
            cache = make_kv_cache(qcfg, exe.config)
            out = exe(input_ids=prompt, cache=cache, use_cache=True)
            t = out.logits[:, -1].argmax(-1, keepdim=True)
            if warm:
                for _ in range(4):
                    out = exe(input_ids=t, cache=out.cache, use_cache=True)
                continue
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                for _ in range(16):
                    out = exe(input_ids=t, cache=out.cache, use_cache=True)
                    t = out.logits[:, -1].argmax(-1, keepdim=True)
    ka = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in ka)
    print(f"== {name}: {total / 16 / 1e3:.1f} ms self CPU per decode step (profiled)")
    for e in sorted(ka, key=lambda e: -e.self_cpu_time_total)[:14]:
        print(f"  {e.key:55s} {100 * e.self_cpu_time_total / total:5.1f}%  calls/step {e.count / 16:6.1f}")
