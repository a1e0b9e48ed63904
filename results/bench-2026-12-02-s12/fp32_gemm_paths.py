"""fp32 GEMM throughput at the learner's shapes (3,048 tokens x 576 -> 1,536 and back), 1 thread: torch.mm (MKL here)
against oneDNN (torch.ops.mkldnn._linear_pointwise) and bf16 for reference; same bits or not.
Run: OMP_NUM_THREADS=1 [MKL_ENABLE_INSTRUCTIONS=AVX512] .venv/bin/python results/bench-2026-12-02-s12/fp32_gemm_paths.py"""
import os, time, torch
torch.set_num_threads(1)
print("torch", torch.__version__, "| MKL available", torch.backends.mkl.is_available(), "| MKL_ENABLE_INSTRUCTIONS",
      os.environ.get("MKL_ENABLE_INSTRUCTIONS"))
print(torch.__config__.show().split("\n")[1:8])
g = torch.Generator().manual_seed(0)
def gflops(fn, flop, reps=5):
    fn(); t0 = time.perf_counter()
    for _ in range(reps): fn()
    return flop * reps / (time.perf_counter() - t0) / 1e9
for m, k, n in ((3048, 576, 1536), (3048, 1536, 576), (3048, 576, 576)):
    x = torch.randn(m, k, generator=g); w = torch.randn(n, k, generator=g)
    flop = 2 * m * k * n
    ref = torch.nn.functional.linear(x, w)
    a = gflops(lambda: torch.nn.functional.linear(x, w), flop)
    b = gflops(lambda: torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], ""), flop)
    same = torch.equal(ref, torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], ""))
    xb, wb = x.bfloat16(), w.bfloat16()
    c = gflops(lambda: torch.nn.functional.linear(xb, wb), flop)
    print(f"[{m} x {k}] @ [{k} x {n}]: F.linear fp32 {a:6.1f} GFLOP/s | oneDNN fp32 {b:6.1f} (same bits {same}) | bf16 {c:6.1f}")
