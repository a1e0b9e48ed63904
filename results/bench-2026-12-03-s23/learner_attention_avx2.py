"""Twenty-third session: the learner's attention kernel (train.learner_attention=kernel) against torch's sdpa, SmolLM2 shapes (9 heads, 3 KV heads, D 64), one row, fp32, 1 thread, forward+backward and forward only."""
import torch, time
import torch.nn.functional as F
from interq.train.learner_attention import causal_attention
import importlib.util, sys
if len(sys.argv) > 1:  # another build of interq's kernels (e.g. the session start's), by its .so path
    _spec = importlib.util.spec_from_file_location(sys.argv[1].rsplit("/", 1)[1].split(".")[0], sys.argv[1])
    _other = importlib.util.module_from_spec(_spec); _spec.loader.exec_module(_other)
    print("kernels:", sys.argv[1])
    import interq.train.learner_attention as _la
    _la._module = lambda: _other
torch.set_num_threads(1)
def t(f, r=3):
    f(); best = 1e9
    for _ in range(r):
        t0 = time.perf_counter(); f(); best = min(best, time.perf_counter() - t0)
    return best * 1e3
for L in (300, 1000, 1760):
    q = torch.randn(1, 9, L, 64, requires_grad=True); k = torch.randn(1, 3, L, 64, requires_grad=True); v = torch.randn(1, 3, L, 64, requires_grad=True)
    def sd():
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True); o.sum().backward()
    def kn():
        o = causal_attention(q, k, v); o.sum().backward()
    def sdf():
        with torch.no_grad(): F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    def knf():
        with torch.no_grad(): causal_attention(q, k, v)
    a, b, c, d = t(sd), t(kn), t(sdf), t(knf)
    print(f"L={L}: fwd+bwd sdpa {a:.1f} ms, kernel {b:.1f} ms ({a/b:.2f}x); fwd sdpa {c:.1f}, kernel {d:.1f} ({c/d:.2f}x)")
