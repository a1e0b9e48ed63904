import torch, sys, time
import torch.nn.functional as F
from interq.quant import kernels
m = kernels.load()
g = torch.Generator().manual_seed(11)
bad = tot = 0
cfgs = []
for L in list(range(1, 40)) + [63, 64, 65, 100, 255, 256, 300, 511, 512, 513, 700, 1024, 1100, 1600, 2100]:
    for G in (3, 2, 7, 16):
        cfgs.append((L, G, 64))
cfgs += [(L, 4, 128) for L in (5, 77, 600)] + [(L, 2, 32) for L in (5, 77, 600)] + [(300, 16, 64)]
for L, G, D in cfgs:
    B = 6
    q = (torch.randn(B, 3, G, D, generator=g) * 2).bfloat16()
    k = (torch.randn(B, 3, L, D, generator=g) * 2).bfloat16()
    v = torch.randn(B, 3, L, D, generator=g).bfloat16()
    cut = torch.randint(0, L, (B,), generator=g)
    bm = torch.ones(B, 1, 1, L, dtype=torch.bool)
    for b in range(B): bm[b, ..., :cut[b]] = False
    fm = torch.zeros(B, 1, 1, L, dtype=torch.bfloat16).masked_fill(~bm, float("-inf"))
    fm2 = torch.zeros(B, 1, 1, L, dtype=torch.bfloat16).masked_fill(~bm, torch.finfo(torch.bfloat16).min)
    for mk in (None, bm, fm, fm2):
        ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mk, scale=D ** -0.5)
        o, ex = m.flash_decode_amx(q, k, v, mk, D ** -0.5)
        assert ex
        bb = int((o.view(torch.int16) != ref.view(torch.int16)).sum()); bad += bb; tot += o.numel()
        if bb: print("BAD", L, G, D, None if mk is None else mk.dtype, bb)
print("bad", bad, "of", tot)
