"""How far the learner's log-probs move with the attention implementation (SmolLM2, 2 rows x 600 tokens of random
ids, 1 thread): torch's flash (sdpa), interq's kernel, and a float64 attention (the reference: q, k, v cast to
float64, causal softmax, back to fp32), for the plain fp32 learner and the aligned (W8A8-KV8 fake-quantized) one.
Fourteenth session."""
import sys
import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
from interq.models.pretrained import load_smollm2
from interq.quant import QuantConfig
from interq.rollout import sequence_logprobs
from interq.train import learner_attention as LA
from interq.train.rl import learner_context

torch.set_num_threads(1)


def f64_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kw):
    assert attention_mask is None
    out = F.scaled_dot_product_attention(query.double(), key.double(), value.double(), is_causal=True, scale=scaling,
                                         enable_gqa=True)
    return out.transpose(1, 2).contiguous().to(query.dtype), None


AttentionInterface.register("f64_ref", f64_attention)
AttentionMaskInterface.register("f64_ref", sdpa_mask)
model = load_smollm2(torch.float32)[0].float().eval()
g = torch.Generator().manual_seed(0)
ids = torch.randint(100, 40000, (2, 600), generator=g)
mask = torch.ones_like(ids)
score = torch.rand(ids.shape, generator=g) < 0.2
for align in (False, True):
    lp = {}
    for name in ("f64", "sdpa", "kernel"):
        real = LA.kernel_attention
        if name == "f64":  # in the kernel's place (the aligned forward wraps it: K/V fake quantization, then it)
            LA.kernel_attention = f64_attention
        with torch.no_grad(), learner_context(model, align, QuantConfig(), attention="sdpa" if name == "sdpa" else "kernel"):
            lp[name] = sequence_logprobs(model, ids, mask, temperature=1.0, score_mask=score)[score]
        LA.kernel_attention = real
    for a, b in (("sdpa", "f64"), ("kernel", "f64"), ("kernel", "sdpa")):
        d = (lp[a] - lp[b]).abs()
        print(f"{'aligned' if align else 'plain'} learner: |{a} - {b}| mean {float(d.mean()):.2e} max {float(d.max()):.2e} "
              f"(mean log-prob {float(lp[b].mean()):.3f})", flush=True)
