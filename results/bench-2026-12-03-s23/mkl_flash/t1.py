import torch, time
from torch.utils.cpp_extension import load
t = time.time()
m = load("fdx", ["results/bench-2026-12-03-s23/mkl_flash/fd.cpp"], extra_cflags=["-O2", "-march=native", "-ffp-contract=off"], verbose=False)
print("built", time.time() - t)
torch.set_num_threads(1)
fa = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
g = torch.Generator().manual_seed(0)
for (B, G, D, L) in [(8, 3, 64, 1), (8, 3, 64, 5), (8, 3, 64, 40), (8, 3, 64, 300), (4, 3, 64, 513), (4, 3, 64, 1100), (8, 4, 32, 77), (8, 8, 128, 200)]:
    q = torch.randn(B, 1, G, D, generator=g).bfloat16(); k = torch.randn(B, 1, L, D, generator=g).bfloat16(); v = torch.randn(B, 1, L, D, generator=g).bfloat16()
    sc = 1 / D ** 0.5
    out, lse = fa(q, k, v, 0.0, False, attn_mask=None, scale=sc)
    res = []
    for pv in (0, 1, 2):
        for ex in (0, 1):
            o, l = m.fd(q, k, v, sc, pv, ex, 0)
            res.append(f"pv{pv}ex{ex}: out {(o != out).sum().item()} lse {(l != lse.view(B, 1, G)).sum().item()}")
    print((B, G, D, L), "; ".join(res))
