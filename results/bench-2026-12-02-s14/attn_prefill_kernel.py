"""Prefill attention at a multi-turn rollout's shapes (the thirteenth session's attn_prefill_alt.py shapes: 16 rows x
120 new tokens over a cache of 700 / 1,400 columns, SmolLM2's 9 query heads on 3 KV heads, d 64, bf16, causal with
left padding), 1 thread: torch's masked flash kernel with enable_gqa (sdpa_packed) against interq's masked_attention
(rollout.attention=packed_kernel); ms per layer (best of 5), max |difference| to float64.
Run: OMP_NUM_THREADS=1 .venv/bin/python results/bench-2026-12-02-s14/attn_prefill_kernel.py"""
import time
import torch
import torch.nn.functional as F
from interq.quant import kernels

torch.set_num_threads(1)
mod = kernels.load()
B, HKV, G, D, Q = 16, 3, 3, 64, 120


def t(fn, reps=5):
    fn()
    best = 1e9
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


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
    kern = lambda: mod.masked_attention(q, k, v, mask, scale)
    ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=mask, scale=scale, enable_gqa=True)
    e_f = (flash().double() - ref).abs().max().item()
    e_k = (kern().double().transpose(1, 2) - ref).abs().max().item()
    tf, tk = t(flash), t(kern)
    print(f"ctx {ctx:5d}: flash {tf:7.2f} ms  kernel {tk:7.2f} ms  ({tf / tk:.2f}x)  max |err| vs float64: flash {e_f:.2e} "
          f"kernel {e_k:.2e}", flush=True)
