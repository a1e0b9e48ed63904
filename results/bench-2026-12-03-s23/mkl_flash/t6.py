import torch
exec(open("results/bench-2026-12-03-s23/mkl_flash/t3.py").read().split("for (G, D, L)")[0].replace('"fdx2"', '"fdx4"'))
B, G, D, L = 8, 3, 64, 40
q = torch.zeros(B, 1, G, D).bfloat16(); k = torch.randn(B, 1, L, D, generator=g).bfloat16(); v = cancel_v(B, L, D)
out, lse = fa(q, k, v, 0.0, False, attn_mask=None, scale=0.125)
o = m.fd(q, k, v, 0.125, 0, 0, 0)[0]
idx = (o != out).nonzero()[:8]
for i in idx.tolist():
    print(i, out[tuple(i)].item(), o[tuple(i)].item(), "exact sum/L", v[i[0], 0, :, i[3]].double().sum().item() / L)
for pv in (0, 1, 2, 3, 4, 105, 120, 1120):
    print(pv, m.fd(q, k, v, 0.125, pv, 0, 0)[0][0, 0, 0, 0].item())
vv = v[0, 0, :, 0].float()
s = torch.zeros(()); 
for j in range(L): s = s + vv[j]
print("py seq", s.item() / L, "torch", out[0,0,0,0].item(), "vals", vv[:10].tolist())
