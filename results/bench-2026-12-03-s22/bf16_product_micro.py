import torch, time, sys
from torch import nn
from interq.quant import kernels
from interq.quant.packed_linear import _probe
mod = kernels.load()
def pack(w):
    n, k = w.shape
    order = mod.bf16_avx2_k_order(k)
    wp = nn.functional.pad(w[:, order], (0, 0, 0, -n % 16))
    return wp.view(-1, 16, k).permute(0, 2, 1).contiguous()
bad = 0
for (m, k, n) in [(1, 576, 64), (16, 576, 64), (16, 576, 250), (16, 1536, 64), (4, 64, 64), (3, 100, 40), (5, 72, 33), (7, 31, 20), (6, 200, 50), (300, 576, 64), (13, 16, 17), (2, 3, 5), (1, 1, 1), (8, 960, 576)]:
    for bias in (False, True):
        for th in (1, 2):
            torch.set_num_threads(th)
            x, w, b = _probe(m, k, n, bias)
            ref = nn.functional.linear(x, w, b)
            got = mod.bf16_linear_avx2(x, pack(w), n, b)
            d = (ref.view(torch.int16) != got.view(torch.int16)).sum().item()
            bad += d
            if d: print("DIFF", (m, k, n, bias, th), d)
print("total differing", bad)
torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
for (m, k, n) in [(16, 576, 49152), (16, 576, 960), (16, 576, 3072), (16, 1536, 576), (1, 576, 49152), (256, 576, 3072)]:
    x = torch.randn(m, k).bfloat16(); w = torch.randn(n, k).bfloat16(); p = pack(w)
    def t(f, r=3):
        f(); best = 1e9
        for _ in range(r):
            t0 = time.perf_counter(); f(); best = min(best, time.perf_counter() - t0)
        return best * 1e3
    ta = t(lambda: mod.bf16_linear_avx2(x, p, n, None)); tb = t(lambda: nn.functional.linear(x, w))
    same = torch.equal(mod.bf16_linear_avx2(x, p, n, None), nn.functional.linear(x, w))
    print(f"{m}x{k}x{n}: avx2 {ta:.2f} ms, F.linear {tb:.2f} ms ({tb/ta:.1f}x) same {same}")
