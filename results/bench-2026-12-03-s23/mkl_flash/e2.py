import sys, torch
sys.path.insert(0, "results/bench-2026-12-03-s23/mkl_flash")
from emul import dot_emul, dot_ilp4
torch.set_num_threads(1)
fa = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
g = torch.Generator().manual_seed(0)
for D in (64, 72, 100, 128):
    q = torch.randn(8, 1, 8, D, generator=g).bfloat16(); k = torch.randn(8, 1, 1, D, generator=g).bfloat16(); v = torch.randn(8, 1, 1, D, generator=g).bfloat16()
    out, lse = fa(q, k, v, 0.0, False, attn_mask=None, scale=1.0)
    l = lse.view(8, 8)
    em = torch.stack([dot_ilp4(q[b, 0], k[b, 0])[:, 0] for b in range(8)])
    print(D, "ilp4 eq", (l == em).float().mean().item())
