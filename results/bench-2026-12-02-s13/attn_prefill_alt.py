"""Prefill attention at a multi-turn rollout's shapes (16 rows x 120 new tokens over a cache of 700 / 1,400 columns,
SmolLM2: 9 query heads on 3 KV heads, d 64, bf16, causal with left padding), 1 thread: torch's masked flash kernel
with enable_gqa (what sdpa_packed runs) against the same attention as plain ops with the query heads of a KV head
stacked (bf16 matmuls, fp32 softmax; and all fp32); ms per layer, max |difference| to float64.
Run: OMP_NUM_THREADS=1 .venv/bin/python results/bench-2026-12-02-s13/attn_prefill_alt.py"""
import time
import torch
import torch.nn.functional as F
torch.set_num_threads(1)
B, HKV, G, D, Q = 16, 3, 3, 64, 120
def t(fn, reps=5):
    fn()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps * 1e3
for ctx in (700, 1400):
    g = torch.Generator().manual_seed(ctx)
    q = torch.randn(B, HKV * G, Q, D, generator=g).bfloat16()
    k = torch.randn(B, HKV, ctx, D, generator=g).bfloat16()
    v = torch.randn(B, HKV, ctx, D, generator=g).bfloat16()
    pad = torch.randint(0, 100, (B,), generator=g)
    col = torch.arange(ctx)[None, None, :]
    row = torch.arange(ctx - Q, ctx)[None, :, None]
    mask = ((col <= row) & (col >= pad[:, None, None]))[:, None]  # [B, 1, Q, ctx]
    scale = D ** -0.5
    flash = lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True)
    qs = q.reshape(B, HKV, G * Q, D)  # the G heads of a KV head stacked
    ms = mask.expand(B, G, Q, ctx).reshape(B, 1, G * Q, ctx)
    def plain():
        s = torch.matmul(qs, k.transpose(-1, -2)).float() * scale
        s = s.masked_fill(~ms, float("-inf"))
        return torch.matmul(torch.softmax(s, -1).bfloat16(), v).reshape(B, HKV * G, Q, D)
    def plain32():
        s = torch.matmul(qs.float(), k.float().transpose(-1, -2)) * scale
        s = s.masked_fill(~ms, float("-inf"))
        return torch.matmul(torch.softmax(s, -1), v.float()).reshape(B, HKV * G, Q, D).bfloat16()
    ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=mask, scale=scale, enable_gqa=True)
    err = {n: (f().double() - ref).abs().max().item() for n, f in (("flash", flash), ("plain", plain), ("plain32", plain32))}
    print(f"ctx {ctx:5d}: flash {t(flash):7.2f} ms  plain bf16 {t(plain):7.2f} ms  plain fp32 {t(plain32):7.2f} ms  "
          f"max err flash {err['flash']:.2e} plain {err['plain']:.2e} plain32 {err['plain32']:.2e}", flush=True)
