"""Decode attention at a rollout's shapes (16 rows, SmolLM2: 9 query heads on 3 KV heads, d 64, bf16, ragged mask),
1 thread: torch's flash kernel and interq's decode_attention kernel as the packed path calls it, against the same attention as three plain ops (bf16
q @ k^T, fp32 softmax, bf16 @ v) and in fp32; ms per layer and max |difference| to an fp64 reference.
Run: OMP_NUM_THREADS=1 .venv/bin/python results/bench-2026-12-02-s13/attn_decode_alt.py"""
import time
import torch
import torch.nn.functional as F
from interq.quant import kernels
torch.set_num_threads(1)
mod = kernels.load()
B, HKV, G, D = 16, 3, 3, 64
def t(fn, reps=30):
    fn()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps * 1e3
for ctx in (256, 1024, 2048):
    g = torch.Generator().manual_seed(ctx)
    q = torch.randn(B, HKV, G, D, generator=g).bfloat16()
    k = torch.randn(B, HKV, ctx, D, generator=g).bfloat16()
    v = torch.randn(B, HKV, ctx, D, generator=g).bfloat16()
    lens = torch.randint(ctx // 2, ctx + 1, (B,), generator=g)
    mask = (torch.arange(ctx)[None, :] < lens[:, None])[:, None, None, :]  # [B, 1, 1, ctx] bool
    scale = D ** -0.5
    flash = lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    def plain():
        s = torch.matmul(q, k.transpose(-1, -2)).float() * scale
        s = s.masked_fill(~mask, float("-inf"))
        return torch.matmul(torch.softmax(s, -1).bfloat16(), v)
    def plain32():
        s = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale
        s = s.masked_fill(~mask, float("-inf"))
        return torch.matmul(torch.softmax(s, -1), v.float()).bfloat16()
    kern = lambda: mod.decode_attention(q, k, v, mask, scale)
    s = torch.matmul(q.double(), k.double().transpose(-1, -2)) * scale
    ref = torch.matmul(torch.softmax(s.masked_fill(~mask, float("-inf")), -1), v.double())
    err = {n: (f().double() - ref).abs().max().item() for n, f in (("flash", flash), ("plain", plain), ("plain32", plain32), ("kernel", kern))}
    print(f"ctx {ctx:5d}: flash {t(flash):6.2f} ms  plain bf16 {t(plain):6.2f} ms  plain fp32 {t(plain32):6.2f} ms  "
          f"kernel {t(kern):6.2f} ms  max err flash {err['flash']:.2e} plain {err['plain']:.2e} plain32 {err['plain32']:.2e} kernel {err['kernel']:.2e}", flush=True)
