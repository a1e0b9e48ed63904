import torch, time
from torch import nn
from interq.quant import kernels
mod = kernels.load()
def pack(w):
    n, k = w.shape
    order = mod.bf16_avx2_k_order(k)
    return nn.functional.pad(w[:, order], (0, 0, 0, -n % 16)).view(-1, 16, k).permute(0, 2, 1).contiguous()
for th in (1, 2):
    torch.set_num_threads(th)
    for (k, n) in [(576, 49152), (576, 960), (1536, 576)]:
        w = torch.randn(n, k).bfloat16(); p = pack(w)
        row = []
        for m in (1, 2, 3, 4, 8):
            x = torch.randn(m, k).bfloat16()
            def t(f, r=5):
                f(); best = 1e9
                for _ in range(r):
                    t0 = time.perf_counter(); f(); best = min(best, time.perf_counter() - t0)
                return best * 1e3
            row.append(f"m{m}: {t(lambda: mod.bf16_linear_avx2(x, p, n, None)):.2f}/{t(lambda: nn.functional.linear(x, w)):.2f}")
        print(th, k, n, " ".join(row))
