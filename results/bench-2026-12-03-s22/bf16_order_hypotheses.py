import torch, itertools
from interq.quant.packed_linear import _probe
torch.set_num_threads(2)
def hyps(x, w):
    xf, wf = x.float(), w.float()
    M, K = x.shape; N = w.shape[0]
    out = {"fp32 F.linear": torch.nn.functional.linear(xf, wf)}
    acc = torch.zeros(M, N)
    for k in range(K):
        acc = acc + xf[:, k:k+1] * wf[:, k][None]
    out["sequential"] = acc
    for lanes in (8, 16):
        a = torch.zeros(M, N, lanes)
        for k0 in range(0, K - K % lanes, lanes):
            a = a + xf[:, None, k0:k0+lanes] * wf[None, :, k0:k0+lanes]
        out[f"{lanes} lanes, sum()"] = a.sum(-1)
    return out
for (m, k, n) in [(1, 576, 64), (16, 576, 64), (16, 576, 256), (16, 1536, 64), (4, 64, 64)]:
    x, w, _ = _probe(m, k, n, False)
    ref = torch.nn.functional.linear(x, w)
    res = {name: (ref != y.bfloat16()).sum().item() for name, y in hyps(x, w).items()}
    print((m, k, n), res)
