import torch
from torch.utils.cpp_extension import load
m = load("fdx2", ["results/bench-2026-12-03-s23/mkl_flash/fd.cpp"], extra_cflags=["-O2", "-march=native", "-ffp-contract=off"], verbose=False)
torch.set_num_threads(1)
fa = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
g = torch.Generator().manual_seed(0)
for (G, D, L) in [(3, 64, 300), (4, 64, 16), (4, 32, 77), (8, 128, 200), (2, 64, 9), (8, 64, 40), (1, 64, 30), (6, 64, 50), (16, 64, 30)]:
    B = 16
    q = torch.randn(B, 1, G, D, generator=g).bfloat16(); k = torch.randn(B, 1, L, D, generator=g).bfloat16(); v = torch.randn(B, 1, L, D, generator=g).bfloat16()
    out, lse = fa(q, k, v, 0.0, False, attn_mask=None, scale=0.125)
    print((G, D, L), " ".join(f"qk{qk}:{(m.fd(q, k, v, 0.125, 0, 0, qk)[1].view(-1) != lse.view(-1)).sum().item()}" for qk in range(6)), "of", B * G)
