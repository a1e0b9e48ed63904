import sys, torch, itertools
import torch.nn.functional as F
sys.path.insert(0, "/tmp/fprobe")
from torch.utils.cpp_extension import load
m = load("fprobe", ["/tmp/fprobe/probe.cpp"], extra_cflags=["-O2", "-march=native", "-ffp-contract=off", "-DCPU_CAPABILITY=AVX512", "-DCPU_CAPABILITY_AVX512"], build_directory="/tmp/fprobe")
torch.manual_seed(0); m.set_exp(1)
def case(B, G, L, masked, seed):
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(B, 3, G, 64, generator=g) * 1.5).bfloat16()
    k = (torch.randn(B, 3, L, 64, generator=g) * 1.5).bfloat16()
    v = torch.randn(B, 3, L, 64, generator=g).bfloat16()
    mask = None
    if masked:
        mask = torch.zeros(B, 1, 1, L, dtype=torch.bfloat16)
        for b in range(B):
            mask[b, ..., : (b * 3) % max(L // 2, 1)] = float("-inf")
    return q, k, v, mask
modes = [(0,0),(1,1),(2,2),(0,1),(1,0),(0,2),(2,0)]
for L in (1, 5, 16, 17, 33, 64, 100, 300, 512, 513, 700):
    for masked in (False, True):
        q, k, v, mask = case(8, 3, L, masked, L)
        ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.125)
        res = []
        for mq, mp in modes:
            o = m.flash_probe(q, k, v, mask if mask is not None else torch.empty(0, dtype=torch.bfloat16), 0.125, mq, mp, 512, 0)
            res.append(f"{mq}{mp}:{(o.view(torch.int16) != ref.view(torch.int16)).float().mean().item():.4f}")
        print(L, masked, " ".join(res), flush=True)
