"""Twentieth session: per-call times (us, best of 5) of interq's norm and int8 kernels at decode sizes. Usage:
norm_quant_micro.py THREADS (run with PYTHONPATH at another checkout's src to time its kernels)."""
import time, torch, sys
from interq.quant import kernels
torch.set_num_threads(int(sys.argv[1]))
mod = kernels.load()
def t(f, n=3000):
    for _ in range(300): f()
    best = 1e9
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n): f()
        best = min(best, (time.perf_counter() - t0) / n * 1e6)
    return best
w = torch.randn(576).bfloat16()
for rows in (1, 16, 64):
    x = torch.randn(rows, 576).bfloat16()
    print("rms rows", rows, round(t(lambda: mod.rms_norm_bf16(x, w, 1e-5, 8)), 2))
x = torch.randn(16, 576).bfloat16()
print("torch_row_sums", round(t(lambda: mod.torch_row_sums(x.float(), 8)), 2))
print("x.float()", round(t(lambda: x.float()), 2))
print("empty", round(t(lambda: torch.empty(16, 576)), 2))
from interq.quant.linear import vnni_pack
for (k, n) in ((128, 256), (576, 576), (576, 1536*2)):
    wq = torch.randint(-127, 127, (k, n), dtype=torch.int8)
    pk = vnni_pack(wq)
    s = torch.rand(n)
    x = torch.randn(16, k).bfloat16()
    print("int8_linear_amx", k, n, round(t(lambda: mod.int8_linear_amx(x, pk, s, [n], 127, torch.bfloat16)), 2))
    print("int8_gemm_amx  ", k, n, round(t(lambda: mod.int8_gemm_amx(torch.randint(-3, 3, (16, k), dtype=torch.int8), pk, n)), 2))
    print("quant_act_int8 ", k, n, round(t(lambda: mod.quant_act_int8(x, 127)), 2))
