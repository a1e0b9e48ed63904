"""Eighteenth session: the W8A8 executor's linears of one SmolLM2-135M decode step at ROWS rows (each fused q|k|v and
gate|up group, each o and down QuantLinear, and the bf16 lm_head once; weights streamed from memory as in the
engine) against the bf16 executor's, alternated; then the int8 group's parts (activation quantization, AMX GEMM,
epilogue) timed alone at 16 rows, hot. Usage: decode_linears_int8.py [THREADS] [ROWS]"""
import sys
import time

import torch

from interq.machine import describe, machine_info
from interq.models.pretrained import load_smollm2
from interq.quant import BF16_EXECUTOR, QuantConfig, kernels, make_executor
from interq.quant import packed_linear as pl
from interq.quant.linear import FusedQuantLinear, QuantLinear

threads = int(sys.argv[1]) if len(sys.argv) > 1 else 2
rows = int(sys.argv[2]) if len(sys.argv) > 2 else 16
torch.set_num_threads(threads)
print(describe(machine_info()), flush=True)
learner = load_smollm2(torch.bfloat16)[0]
arms = {"bf16": make_executor(learner, BF16_EXECUTOR), "w8a8": make_executor(learner, QuantConfig())}
mods = {"bf16": [m for m in arms["bf16"].modules() if isinstance(m, pl.PackedBf16Linear)],
        "w8a8": [m for m in arms["w8a8"].modules() if isinstance(m, (FusedQuantLinear, QuantLinear, pl.PackedBf16Linear))]}
ins = {a: {m: torch.randn(rows, m.in_features).bfloat16() for m in ms} for a, ms in mods.items()}
res = {a: [] for a in arms}
with torch.no_grad():
    for r in range(6):
        for a in arms:
            for m in mods[a]:
                m(ins[a][m])
            t = time.perf_counter()
            for _ in range(5):
                for m in mods[a]:
                    m(ins[a][m])
            res[a].append((time.perf_counter() - t) / 5 * 1e3)
    for a in arms:
        print(f"{a}: {len(mods[a])} modules per step {min(res[a]):.1f} ms (min of 6; all "
              f"{', '.join(f'{v:.1f}' for v in res[a])})")
    print(f"step's linears: int8 {min(res['bf16']) / min(res['w8a8']):.2f}x bf16")

    def hot(f, n=50):
        f()
        best = 1e9
        for _ in range(5):
            t = time.perf_counter()
            for _ in range(n):
                f()
            best = min(best, (time.perf_counter() - t) / n)
        return best * 1e6

    mod = kernels.get()
    g = next(m for m in mods["w8a8"] if isinstance(m, FusedQuantLinear) and m.weight_q.shape[-1] > 2000)  # gate|up
    x = ins["w8a8"][g]
    q, s = mod.quant_act_int8(x, 127)
    acc = mod.int8_gemm_amx(q, g.weight_vnni, g.weight_q.shape[1])
    ep = lambda: mod.epilogue(acc, s, g.weight_scale, list(g.sizes), torch.bfloat16)
    print(f"gate|up group at {rows} rows (hot): epilogue {hot(ep):.1f} us")
    bf = next(m for m in mods["bf16"] if m.out_features == 1536)
    xb = ins["bf16"][bf]
    print(f"bf16 gate_proj (one of two) at {rows} rows (hot): {hot(lambda: bf(xb)):.1f} us")
    print(f"gate|up group at {rows} rows (hot): module {hot(lambda: g(x)):.1f} us; quant_act_int8 "
          f"{hot(lambda: mod.quant_act_int8(x, 127)):.1f} us, int8_gemm_amx {hot(lambda: mod.int8_gemm_amx(q, g.weight_vnni, g.weight_q.shape[1])):.1f} us")
