"""Twenty-third session: fp32 GEMMs at the learner's shapes, torch (MKL) against oneDNN (train.learner_gemm=onednn), 1 thread."""
import torch, time
from interq.train.onednn_gemm import linear_fp32
torch.set_num_threads(1)
def t(f, r=5):
    f(); best = 1e9
    for _ in range(r):
        t0 = time.perf_counter(); f(); best = min(best, time.perf_counter() - t0)
    return best
for (m, k, n) in [(1040, 576, 1536), (1040, 1536, 576), (1040, 576, 960), (1040, 576, 49152)]:
    x = torch.randn(m, k); w = torch.randn(n, k)
    a = t(lambda: torch.nn.functional.linear(x, w)); b = t(lambda: linear_fp32(x, w))
    fl = 2 * m * k * n
    print(f"{m}x{k}x{n}: MKL {fl/a/1e9:.1f} GFLOP/s, oneDNN {fl/b/1e9:.1f} GFLOP/s ({a/b:.2f}x)")
