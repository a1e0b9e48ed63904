"""The vnni backend's kernel against torch._int_mm at SmolLM2-135M's shapes (q|k|v 576x960, o 576x576, gate|up
576x3072, down 1536x576), all 30 layers' weights cycled as a decode step reads them (108 MB: from memory, not
cache), by number of activation rows M; ms per 30 layers (best of two timings of 10), same values checked.
Run: .venv/bin/python results/bench-2026-12-02-s13/vnni_gemm.py [--threads 1,2] [--rows 1,8,16,...]"""
import argparse, time
import torch
from interq.machine import describe, machine_info
from interq.quant import kernels
from interq.quant.linear import vnni_pack

ap = argparse.ArgumentParser()
ap.add_argument("--threads", default="1,2")
ap.add_argument("--rows", default="1,8,16,32,64,128,256,512,2048")
args = ap.parse_args()
mod = kernels.load()
assert mod is not None and mod.has_int8_gemm_vnni(), kernels.status()
print(describe(machine_info()))
SHAPES = ((576, 960), (576, 576), (576, 3072), (1536, 576))
g = torch.Generator().manual_seed(0)
layers = [[torch.randint(-128, 128, (k, n), generator=g, dtype=torch.int8) for k, n in SHAPES] for _ in range(30)]
packed = [[vnni_pack(w) for w in layer] for layer in layers]
for th in (int(t) for t in args.threads.split(",")):
    torch.set_num_threads(th)
    for m in (int(r) for r in args.rows.split(",")):
        xs = [torch.randint(-128, 128, (m, k), generator=g, dtype=torch.int8) for k, _ in SHAPES]
        for x, w, p in zip(xs, layers[0], packed[0]):
            assert torch.equal(torch._int_mm(x, w), mod.int8_gemm_vnni(x, p, w.shape[1]))
        def run_int_mm():
            for layer in layers:
                for x, w in zip(xs, layer):
                    torch._int_mm(x, w)
        def run_vnni():
            for layer in packed:
                for x, p, (_, n) in zip(xs, layer, SHAPES):
                    mod.int8_gemm_vnni(x, p, n)
        def best(fn, reps=10):
            fn()
            out = []
            for _ in range(2):
                t0 = time.perf_counter()
                for _ in range(reps):
                    fn()
                out.append((time.perf_counter() - t0) / reps * 1e3)
            return min(out)
        ti, tv = best(run_int_mm), best(run_vnni)
        print(f"threads {th} M {m:5d}: _int_mm {ti:8.2f} ms  vnni {tv:8.2f} ms  _int_mm/vnni {ti / tv:5.2f}", flush=True)
