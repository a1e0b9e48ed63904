"""_int_mm vs bf16 linear at SmolLM2's decode shapes (M=16), cycling through 30 layers' weights (as a decode step
reads them: not in cache) and with one weight (in cache); per-call us, wall, threads 1 and 2."""
import time, torch
SHAPES = (("qkv", 576, 960), ("o", 576, 576), ("gate_up", 576, 3072), ("down", 1536, 576))
g = torch.Generator().manual_seed(0)
for th in (1, 2):
    torch.set_num_threads(th)
    for name, k, n in SHAPES:
        ws = [torch.randint(-127, 128, (k, n), generator=g, dtype=torch.int8) for _ in range(30)]
        wb = [torch.randn(n, k, dtype=torch.bfloat16) for _ in range(30)]
        x = torch.randint(-127, 128, (16, k), generator=g, dtype=torch.int8); xb = torch.randn(16, k, dtype=torch.bfloat16)
        def t(fn, reps=20):
            fn()
            t0 = time.perf_counter()
            for _ in range(reps): fn()
            return (time.perf_counter() - t0) / reps / 30 * 1e6
        cold_i = t(lambda: [torch._int_mm(x, w) for w in ws]); hot_i = t(lambda: [torch._int_mm(x, ws[0]) for w in ws])
        cold_b = t(lambda: [torch.nn.functional.linear(xb, w) for w in wb]); hot_b = t(lambda: [torch.nn.functional.linear(xb, wb[0]) for w in wb])
        print(f"threads {th} {name:8s}: int_mm cold {cold_i:6.1f} hot {hot_i:6.1f} | bf16 cold {cold_b:6.1f} hot {hot_b:6.1f} us | cold bf16/int8 {cold_b / cold_i:.2f}")
