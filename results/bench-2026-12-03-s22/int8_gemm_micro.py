import torch, time
from interq.quant import kernels
from interq.quant.linear import vnni_pack, int_mm_fp32_exact, int_mm_padded
mod = kernels.load()
print("has avx2", mod.has_int8_gemm_avx2())
g = torch.Generator().manual_seed(0)
for (m, k, n) in [(1, 4, 1), (2, 8, 17), (3, 64, 33), (5, 576, 960), (16, 576, 3072), (16, 1536, 576), (7, 100, 49), (300, 576, 192)]:
    kp = (k + 3) // 4 * 4
    a = torch.randint(-128, 128, (m, kp), generator=g, dtype=torch.int8)
    w = torch.randint(-128, 128, (kp, n), generator=g, dtype=torch.int8)
    # extremes
    if m >= 2:
        a[0] = -128; w[:, 0] = -128; a[1] = 127; 
    ref = int_mm_padded(a, w)
    out = mod.int8_gemm_avx2(a, vnni_pack(w), n)
    print(m, k, n, torch.equal(ref, out))
torch.set_num_threads(1)
for (m, k, n) in [(16, 576, 960), (16, 576, 3072), (16, 1536, 576), (256, 576, 3072), (2240, 576, 3072)]:
    a = torch.randint(-127, 128, (m, k), generator=g, dtype=torch.int8)
    w = torch.randint(-127, 128, (k, n), generator=g, dtype=torch.int8)
    p = vnni_pack(w); wf = w.float()
    wb = torch.randn(n, k, dtype=torch.bfloat16); xb = torch.randn(m, k, dtype=torch.bfloat16)
    def t(f, r=5):
        f(); best = 1e9
        for _ in range(r):
            t0 = time.perf_counter(); f(); best = min(best, time.perf_counter() - t0)
        return best * 1e3
    ta = t(lambda: mod.int8_gemm_avx2(a, p, n)); tf = t(lambda: int_mm_fp32_exact(a, wf)); tb = t(lambda: torch.nn.functional.linear(xb, wb))
    print(f"{m}x{k}x{n}: avx2 {ta:.2f} ms, fp32_exact {tf:.2f} ms, bf16 F.linear {tb:.2f} ms")
