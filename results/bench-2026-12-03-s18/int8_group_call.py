import time, torch
from interq.quant import QuantConfig, kernels, make_executor
from interq.quant.linear import FusedQuantLinear, amx_linear
from interq.models.pretrained import load_smollm2
torch.set_num_threads(2)
exe = make_executor(load_smollm2(torch.bfloat16)[0], QuantConfig())
g = next(m for m in exe.modules() if isinstance(m, FusedQuantLinear) and m.weight_q.shape[-1] > 2000)
mod = kernels.get()
x = torch.randn(16, 576).bfloat16()
def hot(f, n=300):
    f(); best = 1e9
    for _ in range(7):
        t = time.perf_counter()
        for _ in range(n): f()
        best = min(best, (time.perf_counter() - t) / n)
    return best * 1e6
vn, sw, sizes = g.weight_vnni, g.weight_scale, list(g.sizes)
with torch.no_grad():
    for _ in range(3):
        print(f"module {hot(lambda: g(x)):.1f} us, forward {hot(lambda: g.forward(x)):.1f}, amx_linear {hot(lambda: amx_linear(x, g.weight_q, vn, sw, g.sizes, None, 'half_even', 8, torch.bfloat16, True)):.1f}, kernel {hot(lambda: mod.int8_linear_amx(x, vn, sw, sizes, 127, torch.bfloat16)):.1f}, empty {hot(lambda: torch.empty(16, 1536, dtype=torch.bfloat16)):.1f}")
