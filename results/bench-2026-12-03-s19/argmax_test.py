import torch, time
from interq.quant import kernels
m = kernels.load()
g = torch.Generator().manual_seed(0)
bad = 0
for v in (1, 2, 15, 16, 17, 31, 32, 33, 47, 100, 1000, 49152, 151936):
    for trial in range(6):
        p = torch.rand(5, v, generator=g)
        e = torch.rand(5, v, generator=g) + 1e-3
        if trial == 1: p[:, ::7] = 0.5; e[:, ::7] = 1.0   # many ties
        if trial == 2: p = p.round(decimals=1); e = torch.ones_like(e)  # ties everywhere
        if trial == 3: p[1, v // 2] = float("nan"); p[2, -1] = float("nan"); p[3, 0] = float("nan")
        if trial == 4: p[0, :] = 0; p[4, v // 3:] = float("nan")
        if trial == 5: e[1, 3 % v] = 0.0; p[1, 3 % v] = 0.0  # 0/0 = NaN
        ref = p.div(e).argmax(-1)
        out = m.race_argmax(p.contiguous(), e.contiguous())
        if not torch.equal(ref, out): bad += 1; print("BAD", v, trial, ref.tolist(), out.tolist())
print("bad", bad)
p = torch.rand(16, 49152); e = torch.rand(16, 49152)
for th in (1, 2):
    torch.set_num_threads(th)
    def t(f, n=50):
        f(); t0 = time.perf_counter()
        for _ in range(n): f()
        return (time.perf_counter() - t0) / n * 1e3
    print(th, "torch div+argmax ms", t(lambda: p.div(e).argmax(-1)), "kernel ms", t(lambda: m.race_argmax(p, e)))
