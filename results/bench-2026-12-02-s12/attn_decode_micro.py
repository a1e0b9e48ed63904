"""torch's CPU flash SDPA at SmolLM2's packed decode shape (q [16, 3, 3, 64], K/V [16, 3, T, 64], bf16): us per call."""
import time, torch
import torch.nn.functional as F
def us(fn, reps=200):
    fn(); t0 = time.perf_counter()
    for _ in range(reps): fn()
    return (time.perf_counter() - t0) / reps * 1e6
for th in (1, 2):
    torch.set_num_threads(th)
    for T in (32, 256, 1024, 2048):
        q = torch.randn(16, 3, 3, 64, dtype=torch.bfloat16); k = torch.randn(16, 3, T, 64, dtype=torch.bfloat16); v = torch.randn_like(k)
        m = torch.ones(16, 1, 1, T, dtype=torch.bool); m[:4, ..., :5] = False
        a = us(lambda: F.scaled_dot_product_attention(q, k, v))
        b = us(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=m))
        print(f"threads {th} T={T:5d}: no mask {a:7.1f} us, bool mask {b:7.1f} us")
