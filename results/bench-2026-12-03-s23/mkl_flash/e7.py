import torch, itertools
torch.set_num_threads(1)
fa = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
big, s = 65536.0, 0.125 * (1 + 93 / 128)
for L, D, G in [(3, 64, 3), (4, 64, 3), (3, 64, 4), (5, 64, 3), (8, 64, 3)]:
    q = torch.zeros(1, 1, G, D).bfloat16()
    k = torch.zeros(1, 1, L, D).bfloat16()
    res = {}
    for perm in itertools.permutations(range(3)):
        vals = [big, -big, s] + [0.0] * (L - 3)
        v = torch.zeros(1, 1, L, D)
        for j in range(3): v[0, 0, perm[j], :] = vals[j]
        out, _ = fa(q, k, v.bfloat16(), 0.0, False, attn_mask=None, scale=0.125)
        o = out[0, 0, 0].float() * L
        res[perm] = (round(o[0].item(), 5), round(o[8].item(), 5))
    print(f"L={L} G={G}: (d0, d8) per position of (big, -big, s):", res)
