import sys, torch
sys.path.insert(0, "results/bench-2026-12-03-s23/mkl_flash")
from emul import dot_emul
torch.set_num_threads(1)
fa = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
g = torch.Generator().manual_seed(0)
for D in (64, 72, 100):
    q = torch.randn(4, 1, 8, D, generator=g).bfloat16(); k = torch.randn(4, 1, 1, D, generator=g).bfloat16(); v = torch.randn(4, 1, 1, D, generator=g).bfloat16()
    out, lse = fa(q, k, v, 0.0, False, attn_mask=None, scale=1.0)
    em = torch.stack([dot_emul(q[b, 0], k[b, 0])[:, 0] for b in range(4)])  # [4, 8]
    l = lse.view(4, 8)
    print(D, "fp32 eq", (l == em).float().mean().item(), "bf16 eq", (l == em.bfloat16().float()).float().mean().item(),
          "seq eq", (l == (q.float()[:, 0] * k.float()[:, 0]).sum(-1)).float().mean().item(), "out==v", torch.equal(out[:, 0], v[:, 0].expand(4, 8, D)))
    print("   lse", l[0, :3].tolist(), "emul", em[0, :3].tolist())
