"""Twenty-third session: rollout.attention=packed_kernel's decode_attention against torch's sdpa (the packed [B, Hkv, G, D] call), SmolLM2 shapes, 16 rows, 1 thread, bf16."""
import torch, time
import torch.nn.functional as F
from interq.quant import kernels
mod = kernels.load()
import importlib.util, sys
if len(sys.argv) > 1:  # another build of interq's kernels (e.g. the session start's), by its .so path
    _spec = importlib.util.spec_from_file_location(sys.argv[1].rsplit("/", 1)[1].split(".")[0], sys.argv[1])
    _other = importlib.util.module_from_spec(_spec); _spec.loader.exec_module(_other)
    print("kernels:", sys.argv[1])
    mod = _other
torch.set_num_threads(1)
def t(f, r=5):
    f(); best = 1e9
    for _ in range(r):
        t0 = time.perf_counter(); f(); best = min(best, time.perf_counter() - t0)
    return best * 1e3
for L in (32, 300, 1000, 2000, 3000):
    q = torch.randn(16, 3, 3, 64).bfloat16(); k = torch.randn(16, 3, L, 64).bfloat16(); v = torch.randn(16, 3, L, 64).bfloat16()
    a = t(lambda: F.scaled_dot_product_attention(q, k, v, scale=0.125))
    b = t(lambda: mod.decode_attention(q, k, v, None, 0.125))
    o1 = F.scaled_dot_product_attention(q, k, v, scale=0.125); o2 = mod.decode_attention(q, k, v, None, 0.125)
    print(f"L={L}: torch sdpa {a:.3f} ms, decode_attention {b:.3f} ms ({a/b:.1f}x), max|diff| {(o1.float()-o2.float()).abs().max().item():.2e}, bits equal {(o1 == o2).float().mean().item():.3f}")
