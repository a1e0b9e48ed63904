import torch, time
from interq.quant import kernels
from interq.quant.linear import vnni_pack
mod = kernels.load()
g = torch.Generator().manual_seed(0)
def t(f, r=20):
    f(); best = 1e9
    for _ in range(r):
        t0 = time.perf_counter(); f(); best = min(best, time.perf_counter() - t0)
    return best * 1e3
for th in (1, 2):
    torch.set_num_threads(th)
    for (m, k, n) in [(16, 576, 3072), (16, 1536, 576), (16, 576, 960)]:
        w = torch.randint(-127, 128, (k, n), generator=g, dtype=torch.int8); p = vnni_pack(w)
        x = torch.randn(m, k).bfloat16(); q = torch.randint(-127, 128, (m, k), generator=g, dtype=torch.int8)
        sw = torch.rand(n) * 0.01
        a = t(lambda: mod.int8_gemm_avx2(q, p, n)); b = t(lambda: mod.int8_linear_avx2(x, p, sw, [n], 127, torch.bfloat16))
        c = t(lambda: mod.quant_act_int8(x, 127))
        print(th, (m, k, n), f"gemm {a:.3f} ms, whole linear {b:.3f} ms, quantize {c:.3f} ms")
