import torch
from interq.quant.packed_linear import _probe
torch.set_num_threads(2)
def vreduce(v):  # v [..., 8] fp32 -> AVX2 vec_reduce_all(plus)
    b = v[..., :4] + v[..., 4:]           # lanes 0-3 (and 4-7 mirror)
    c = torch.stack([b[..., 0] + b[..., 2], b[..., 1] + b[..., 3]], -1)
    return c[..., 0] + c[..., 1]
def dot_emul(x, w):  # x [M, K] bf16, w [N, K] bf16 -> [M, N] fp32 as torch's bf16_dot_with_fp32_arith
    xf, wf = x.float(), w.float()
    M, K = xf.shape; N = wf.shape[0]
    la = K & ~63
    s = torch.zeros(M, N, 8, 8)
    for j in range(0, la, 64):
        p = xf[:, None, j:j+64].reshape(M, 1, 8, 8) * wf[None, :, j:j+64].reshape(1, N, 8, 8)
        s = s + p  # exact products, one rounding each add
    for off in (4, 2, 1):
        s = s[:, :, :off] + s[:, :, off:2*off]
    red = vreduce(s[:, :, 0])
    lav = K & ~15
    t = torch.zeros(M, N, 8)
    for j in range(la, lav, 16):
        t = t + xf[:, None, j:j+8] * wf[None, :, j:j+8]
        t = t + xf[:, None, j+8:j+16] * wf[None, :, j+8:j+16]
    red = red + vreduce(t)
    for j in range(lav, K):
        red = red + (xf[:, None, j] * wf[None, :, j]).bfloat16().float()
    return red
for (m, k, n) in [(1, 576, 64), (16, 576, 64), (16, 576, 256), (16, 1536, 64), (4, 64, 64), (3, 100, 40), (5, 72, 33)]:
    x, w, _ = _probe(m, k, n, False)
    ref = torch.nn.functional.linear(x, w)
    print((m, k, n), (ref != dot_emul(x, w).bfloat16()).sum().item())
def dot_emul2(x, w, round_tail):
    xf, wf = x.float(), w.float()
    M, K = xf.shape; N = wf.shape[0]
    red = dot_emul(x[:, :K & ~15], w[:, :K & ~15])
    for j in range(K & ~15, K):
        p = xf[:, None, j] * wf[None, :, j]
        red = red + (p.bfloat16().float() if round_tail else p)
    return red
for (m, k, n) in [(5, 72, 33), (3, 100, 40), (2, 7, 9), (4, 31, 20), (6, 200, 50)]:
    x, w, _ = _probe(m, k, n, False)
    ref = torch.nn.functional.linear(x, w)
    print((m, k, n), [(ref != dot_emul2(x, w, r).bfloat16()).sum().item() for r in (True, False)])
print("bias / large M")
for (m, k, n) in [(5, 576, 33), (300, 576, 64), (17, 64, 40)]:
    x, w, b = _probe(m, k, n, True)
    d = dot_emul2(x, w, False)
    ref = torch.nn.functional.linear(x, w, b)
    v1 = (b.float() + d).bfloat16(); v2 = (d.bfloat16() + b)
    print((m, k, n), (ref != v1).sum().item(), (ref != v2).sum().item(), "nobias", (torch.nn.functional.linear(x, w) != d.bfloat16()).sum().item())
    ref3 = torch.nn.functional.linear(x.view(1, m, k), w, b).view(m, n)
    print("3d equal 2d:", torch.equal(ref3, ref))
