"""Two micro-measurements behind the in-place KV append (twelfth session):
1. what appending one token by torch.cat costs per decode step (one of K or V, 30 layers, 16 rows, 3 KV heads, head
   dim 64, bf16) against writing the new column into spare capacity;
2. torch's CPU flash SDPA at the packed decode shape (q [16, 3, 3, 64]) on contiguous K/V against prefix views of a
   larger buffer: time per call and whether the bits are the same.
Run: .venv/bin/python results/bench-2026-12-02-s12/kv_views_micro.py"""
import time, torch
import torch.nn.functional as F

def us(fn, reps=30):
    fn(); t0 = time.perf_counter()
    for _ in range(reps): fn()
    return (time.perf_counter() - t0) / reps * 1e6

for th in (1, 2):
    torch.set_num_threads(th)
    for T in (256, 1024, 2048):
        ks = [torch.randn(16, 3, T, 64, dtype=torch.bfloat16) for _ in range(30)]
        new = torch.randn(16, 3, 1, 64, dtype=torch.bfloat16)
        buf = [torch.empty(16, 3, T + 64, 64, dtype=torch.bfloat16) for _ in range(30)]
        cat = us(lambda: [torch.cat([k, new], dim=-2) for k in ks], 10)
        write = us(lambda: [b[:, :, T:T + 1].copy_(new) for b in buf], 10)
        q = torch.randn(16, 3, 3, 64, dtype=torch.bfloat16)
        k, v = ks[0], torch.randn_like(ks[0])
        kb = torch.empty(16, 3, T + 512, 64, dtype=torch.bfloat16); vb = torch.empty_like(kb)
        kb[:, :, :T] = k; vb[:, :, :T] = v
        kv, vv = kb[:, :, :T], vb[:, :, :T]
        m = torch.ones(16, 1, 1, T, dtype=torch.bool); m[:4, ..., :5] = False
        a = us(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=m))
        b = us(lambda: F.scaled_dot_product_attention(q, kv, vv, attn_mask=m))
        same = torch.equal(F.scaled_dot_product_attention(q, k, v, attn_mask=m), F.scaled_dot_product_attention(q, kv, vv, attn_mask=m))
        print(f"threads {th} T={T:5d}: append x30 layers: cat {cat / 1e3:6.2f} ms, column write {write / 1e3:5.2f} ms | "
              f"packed decode SDPA per layer: contiguous {a:7.1f} us, buffer view {b:7.1f} us, same bits {same}", flush=True)
