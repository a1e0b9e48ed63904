import torch
def vreduce(v):  # [..., 8] -> AVX2 vec_reduce_all(plus)
    b = v[..., :4] + v[..., 4:]
    c = torch.stack([b[..., 0] + b[..., 2], b[..., 1] + b[..., 3]], -1)
    return c[..., 0] + c[..., 1]
def dot_emul(x, w):  # x [M, K], w [N, K] bf16 -> [M, N] fp32, torch's bf16_dot_with_fp32_arith (AVX2)
    xf, wf = x.float(), w.float()
    M, K = xf.shape; N = wf.shape[0]
    la = K & ~63
    s = torch.zeros(M, N, 8, 8)
    for j in range(0, la, 64):
        s = s + xf[:, None, j:j+64].reshape(M, 1, 8, 8) * wf[None, :, j:j+64].reshape(1, N, 8, 8)
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
        red = red + xf[:, None, j] * wf[None, :, j]
    return red
def dot_ilp4(x, w):  # x [M, K], w [N, K] -> [M, N] fp32: torch's cpublas sum() with 4 partial sums (x86)
    xf, wf = x.float(), w.float()
    M, K = xf.shape; N = wf.shape[0]
    p = torch.zeros(4, M, N)
    i = 0
    while i + 4 <= K:
        for k in range(4):
            p[k] = p[k] + xf[:, None, i + k] * wf[None, :, i + k]
        i += 4
    while i < K:
        p[0] = p[0] + xf[:, None, i] * wf[None, :, i]; i += 1
    return ((p[0] + p[1]) + p[2]) + p[3]
