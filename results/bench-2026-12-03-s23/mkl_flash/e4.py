import torch
torch.set_num_threads(1)
fa = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
g = torch.Generator().manual_seed(1)
def seq(p):
    s = torch.zeros(p.shape[:-1])
    for i in range(p.shape[-1]): s = s + p[..., i]
    return s
def acc4(p):
    a = torch.zeros(p.shape[:-1] + (4,))
    for i in range(0, p.shape[-1], 4): a = a + p[..., i:i+4]
    return (a[..., 0] + a[..., 2]) + (a[..., 1] + a[..., 3])
def accn_tree(p, n):
    a = torch.zeros(p.shape[:-1] + (n,))
    for i in range(0, p.shape[-1], n): a = a + p[..., i:i+n]
    while a.shape[-1] > 1:
        h = a.shape[-1] // 2; a = a[..., :h] + a[..., h:]
    return a[..., 0]
for D in (16, 32, 48, 64, 96, 128, 256):
    B, G = 64, 8
    q = torch.randn(B, 1, G, D, generator=g).bfloat16(); k = torch.randn(B, 1, 1, D, generator=g).bfloat16()
    out, lse = fa(q, k, k, 0.0, False, attn_mask=None, scale=1.0)
    ref = lse.view(B, G); P = (q.float()[:, 0] * k.float()[:, 0])
    H = {"acc4": acc4(P), "seq": seq(P)}
    for c in (32, 64, 128):  # k blocks of c, acc4 inside, blocks added
        if D > c:
            s = None
            for b0 in range(0, D, c):
                t = acc4(P[..., b0:b0+c]); s = t if s is None else s + t
            H[f"acc4_blocks{c}"] = s
            # accumulators carried across blocks but reduced per block into C
    # acc4 with accumulators initialised... carry: continuing acc across blocks = acc4 (same)
    for n in (8, 16):
        H[f"acc{n}t"] = accn_tree(P, n)
    # 2 rows of 4 lanes? acc8 with lanes reduced as (l0+l4)... try acc8 reduce pairs (i, i+4) then acc4 style
    a = torch.zeros(P.shape[:-1] + (8,))
    for i in range(0, D, 8): a = a + P[..., i:i+8]
    b4 = a[..., :4] + a[..., 4:]
    H["acc8_then4"] = (b4[..., 0] + b4[..., 2]) + (b4[..., 1] + b4[..., 3])
    print(D, "  ".join(f"{k} {(v == ref).float().mean().item():.3f}" for k, v in H.items()))
