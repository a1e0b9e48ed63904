import torch, time, sys
import torch.nn.functional as F
from interq.quant import kernels
m = kernels.load()
torch.set_num_threads(int(sys.argv[1]))
g = torch.Generator().manual_seed(1)
for L in (48, 300, 1000, 2000):
    B = 16
    q = torch.randn(B, 3, 3, 64, generator=g).bfloat16()
    kc = torch.randn(B, 3, L + 100, 64, generator=g).bfloat16()[:, :, :L]
    vc = torch.randn(B, 3, L + 100, 64, generator=g).bfloat16()[:, :, :L]
    mk = torch.ones(B, 1, 1, L, dtype=torch.bool); mk[0, ..., :5] = False
    for mask in (None, mk):
        def t(f, n=50):
            f(); f()
            best = 1e9
            for _ in range(5):
                t0 = time.perf_counter()
                for _ in range(n): f()
                best = min(best, (time.perf_counter() - t0) / n)
            return best * 1e6
        a = t(lambda: F.scaled_dot_product_attention(q, kc, vc, attn_mask=mask, scale=0.125))
        b = t(lambda: m.flash_decode_amx(q, kc, vc, mask, 0.125))
        print(f"L={L} mask={mask is not None}: torch {a:.0f} us, kernel {b:.0f} us, {a/b:.2f}x", flush=True)
