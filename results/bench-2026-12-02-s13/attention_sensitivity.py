"""How far rounding-equivalent attention implementations move the executors' log-probs: SmolLM2-135M, bf16 and W8A8-KV8
executors, 4 rows of 600 random tokens prefilled then 8 decode steps, log-softmax over the whole vocabulary, mean
|difference| between sdpa_packed (default), packed_kernel and transformers' eager attention, and each against the bf16
learner's forward. The W8A8 executor
amplifies rounding-level differences (its int8 activation codes flip) to its mismatch's scale.
Run: .venv/bin/python results/bench-2026-12-02-s13/attention_sensitivity.py"""
import torch, copy
from interq.models.pretrained import load_smollm2
from interq.quant import QuantConfig, make_executor, make_kv_cache
from interq.rollout.attention import set_rollout_attention
torch.set_num_threads(2)
learner, _ = load_smollm2(torch.bfloat16)
qcfg = QuantConfig()
g = torch.Generator().manual_seed(0)
ids = torch.randint(10, 49000, (4, 608), generator=g)
for kind in ("bf16", "int8"):
    base = learner if kind == "bf16" else make_executor(learner, qcfg)
    arms = {"packed": set_rollout_attention(copy.deepcopy(base), "sdpa_packed"), "kernel": set_rollout_attention(copy.deepcopy(base), "packed_kernel")}
    e = copy.deepcopy(base); e.set_attn_implementation("eager"); arms["eager"] = e
    lps = {}
    with torch.inference_mode():
        for name, m in arms.items():
            cache = make_kv_cache(qcfg if kind == "int8" else QuantConfig(kv_format="none"), m.config)
            o = m(input_ids=ids[:, :600], cache=cache, use_cache=True)
            out = []
            for t in range(600, 608):
                o = m(input_ids=ids[:, t:t+1], cache=o.cache, use_cache=True)
                out.append(torch.log_softmax(o.logits[:, -1].float(), -1))
            lps[name] = torch.stack(out, 1)
    for x, y in (("packed", "kernel"), ("packed", "eager"), ("kernel", "eager")):
        print(kind, x, "vs", y, "mean |d logp|", round((lps[x] - lps[y]).abs().mean().item(), 4))
    with torch.inference_mode():  # each against the bf16 learner's one forward over the whole sequence (sdpa)
        ref = torch.log_softmax(learner(input_ids=ids).logits[:, 600:608].float(), -1)
    for name in arms:
        print(kind, name, "vs the bf16 learner: mean |d logp|", round((lps[name] - ref).abs().mean().item(), 4))
