import sys, torch, itertools
torch.set_num_threads(1)
fa = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
g = torch.Generator().manual_seed(1)
B, G, D = 64, 8, 64
q = torch.randn(B, 1, G, D, generator=g).bfloat16(); k = torch.randn(B, 1, 1, D, generator=g).bfloat16()
out, lse = fa(q, k, k, 0.0, False, attn_mask=None, scale=1.0)
ref = lse.view(B, G)
P = (q.float()[:, 0] * k.float()[:, 0])  # [B, G, D] exact products
def seq(p):
    s = torch.zeros(p.shape[:-1])
    for i in range(p.shape[-1]): s = s + p[..., i]
    return s
def accs(p, n, tree=True):
    a = torch.zeros(p.shape[:-1] + (n,))
    for i in range(0, p.shape[-1], n): a = a + p[..., i:i+n]
    if tree:
        while a.shape[-1] > 1:
            h = a.shape[-1] // 2; a = a[..., :h] + a[..., h:]
        return a[..., 0]
    return seq(a)
def pairs(p):
    s = torch.zeros(p.shape[:-1])
    for i in range(0, p.shape[-1], 2): s = s + (p[..., i] + p[..., i + 1])
    return s
def pairs_tree(p, n):
    pp = p[..., 0::2] + p[..., 1::2]
    return accs(pp, n)
H = {"seq": seq(P), "pairs": pairs(P)}
for n in (2, 4, 8, 16, 32):
    H[f"acc{n}_tree"] = accs(P, n); H[f"acc{n}_seq"] = accs(P, n, False)
for n in (1, 2, 4, 8, 16):
    H[f"pairs_acc{n}"] = pairs_tree(P, n) if n > 1 else pairs(P)
# fp32-converted halves: sum of first half and second half
H["halves"] = seq(P[..., :32]) + seq(P[..., 32:])
for name, v in H.items():
    print(f"{name:16s} {(v == ref).float().mean().item():.3f}")
