"""torch._int_mm against oneDNN's prepacked int8 linear (torch.ops.onednn.qlinear_pointwise) at SmolLM2 decode shapes:
exactness of the int32 accumulator and CPU time per call.
Run: OMP_NUM_THREADS=1 .venv/bin/python results/bench-2026-12-02-s12/qlinear_vs_int_mm.py [--threads 1] [--m 16]"""
import argparse, statistics, time
import torch

ap = argparse.ArgumentParser()
ap.add_argument("--threads", type=int, default=1)
ap.add_argument("--m", type=int, default=16)
ap.add_argument("--calls", type=int, default=200)
args = ap.parse_args()
torch.set_num_threads(args.threads)
SHAPES = (("qkv", 576, 960), ("o", 576, 576), ("gate_up", 576, 3072), ("down", 1536, 576))
g = torch.Generator().manual_seed(0)

def cpu_us(fn, calls):
    fn()
    c0 = time.process_time()
    for _ in range(calls):
        fn()
    return (time.process_time() - c0) / calls * 1e6

for name, k, n in SHAPES:
    w = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
    x = torch.randint(-127, 128, (args.m, k), generator=g, dtype=torch.int8)
    x[0] = 127; w[:, :] = w  # extremes present
    wt = w.t().contiguous()
    ref = torch._int_mm(x, wt)
    res = {}
    for xdt in ("s8", "u8"):
        try:
            packed = torch.ops.onednn.qlinear_prepack(w, [args.m, k])
            ones, zeros = torch.ones(n), torch.zeros(n, dtype=torch.int32)
            if xdt == "s8":
                qx, zp = x, 0
            else:
                qx, zp = (x.to(torch.int16) + 128).to(torch.uint8), 128
            f = lambda: torch.ops.onednn.qlinear_pointwise(qx, 1.0, zp, packed, ones, zeros, None, 1.0, 0, torch.float32, "none", [], "")
            out = f()
            exact = torch.equal(out, ref.float())
            res[xdt] = (exact, cpu_us(f, args.calls))
        except Exception as e:  # noqa
            res[xdt] = (repr(e)[:120], None)
    t_int = cpu_us(lambda: torch._int_mm(x, wt), args.calls)
    wb = torch.randn(n, k, dtype=torch.bfloat16); xb = torch.randn(args.m, k, dtype=torch.bfloat16)
    t_bf = cpu_us(lambda: torch.nn.functional.linear(xb, wb), args.calls)
    print(f"{name:8s} K={k} N={n}: _int_mm {t_int:7.1f} us | bf16 linear {t_bf:7.1f} us | " +
          " | ".join(f"qlinear {d}: exact={r[0]} {r[1] and round(r[1], 1)} us" for d, r in res.items()))
