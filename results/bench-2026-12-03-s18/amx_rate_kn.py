"""Eighteenth session: the AMX-BF16 kernel's rate at 656 rows over K x N, one thread (the check of amx_rate.log's K = 576\nvs 1,536 difference). Usage: amx_rate_kn.py"""
import time, torch
from interq.quant import kernels, packed_linear as pl
torch.set_num_threads(1)
mod = kernels.load()
def hot(f, n=10):
    f(); best = 1e9
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(n): f()
        best = min(best, (time.perf_counter() - t) / n)
    return best
for m in (656,):
  for k in (576, 1536, 3072):
    for n in (192, 576, 1536, 4608):
        x = torch.randn(m, k).bfloat16(); w = (torch.randn(n, k) * .05).bfloat16(); p = pl.pack_bf16_amx(w)
        a = hot(lambda: mod.bf16_linear_amx(x, p, n, None, 0))
        print(m, k, n, f"{2*m*k*n/a/1e12:.2f} TFLOPS", flush=True)
