"""The learner's attention kernel (train.learner_attention=kernel) against torch's sdpa, SmolLM2 shapes (9 heads,
3 KV heads, D 64), one row, fp32, one thread, forward+backward through autograd; interleaved, medians of 7."""
import statistics, sys, time, torch
import torch.nn.functional as F
from interq.train.learner_attention import causal_attention
torch.set_num_threads(1)
def run(f):
    t0 = time.perf_counter(); f(); return (time.perf_counter() - t0) * 1e3
for L in [int(x) for x in sys.argv[1:]] or (300, 1000, 1760, 2500):
    q = torch.randn(1, 9, L, 64, requires_grad=True); k = torch.randn(1, 3, L, 64, requires_grad=True); v = torch.randn(1, 3, L, 64, requires_grad=True)
    def sd():
        F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).sum().backward()
    def kn():
        causal_attention(q, k, v).sum().backward()
    def sdf():
        with torch.no_grad(): F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    def knf():
        with torch.no_grad(): causal_attention(q, k, v)
    fs = (sd, kn, sdf, knf); ts = [[] for _ in fs]
    for f in fs: f()
    for _ in range(7):
        for i, f in enumerate(fs): ts[i].append(run(f))
    a, b, c, d = (statistics.median(t) for t in ts)
    print(f"L={L}: fwd+bwd sdpa {a:.1f} ms, kernel {b:.1f} ms ({a/b:.2f}x); fwd sdpa {c:.1f}, kernel {d:.1f} ({c/d:.2f}x)", flush=True)
