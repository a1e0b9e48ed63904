"""The learner backward's GEMM shapes (grad_x = grad_y W, grad_W = grad_y^T x; 3,048 tokens, 576 -> 1,536), 1 thread: torch (MKL)
against oneDNN through torch.ops.mkldnn._linear_pointwise on strided and contiguous operands, ms and error vs float64."""
import time, torch
torch.set_num_threads(1)
lp = lambda a, b: torch.ops.mkldnn._linear_pointwise(a, b, None, "none", [], "")
g = torch.Generator().manual_seed(0)
M, K, N = 3048, 576, 1536
x = torch.randn(M, K, generator=g); w = torch.randn(N, K, generator=g); gy = torch.randn(M, N, generator=g)
def t(fn, reps=5):
    fn(); t0 = time.perf_counter()
    for _ in range(reps): fn()
    return (time.perf_counter() - t0) / reps * 1e3
ref_gx = gy @ w; ref_gw = gy.t() @ x
for name, fn in (("gx mm", lambda: gy @ w), ("gx lp(w.t())", lambda: lp(gy, w.t())), ("gx lp(w.t().contig)", lambda: lp(gy, w.t().contiguous())),
                 ("gw mm", lambda: gy.t() @ x), ("gw lp(gy.t(), x.t())", lambda: lp(gy.t(), x.t())),
                 ("gw lp contig", lambda: lp(gy.t().contiguous(), x.t().contiguous()))):
    out = fn()
    ref = ref_gx if name.startswith("gx") else ref_gw
    err = ((out.double() - (gy.double() @ w.double() if name.startswith("gx") else gy.double().t() @ x.double())).abs().max() /
           (ref.double().abs().max())).item()
    err_ref = ((ref.double() - (gy.double() @ w.double() if name.startswith("gx") else gy.double().t() @ x.double())).abs().max() / ref.double().abs().max()).item()
    print(f"{name:24s} {t(fn):7.1f} ms  rel err vs fp64 {err:.2e} (MKL {err_ref:.2e})")
