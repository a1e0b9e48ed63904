import torch, time
from interq.quant import kernels
m = kernels.load()
bad = 0
for v in (1, 2, 5, 311, 312, 313, 624, 1000, 49152):
    for seed in range(3):
        gens = [torch.Generator().manual_seed(seed * 100 + i) for i in range(4)]
        refg = [torch.Generator().manual_seed(seed * 100 + i) for i in range(4)]
        # advance some generators by odd counts first so states are at different offsets
        for i, (a, b) in enumerate(zip(gens, refg)):
            k = i * 37 + seed
            torch.empty(k).uniform_(generator=a); torch.empty(k).uniform_(generator=b)
            torch.empty(k, dtype=torch.float64).uniform_(generator=a); torch.empty(k, dtype=torch.float64).uniform_(generator=b)
        for rep in range(3):
            out = torch.empty(4, v, dtype=torch.float64)
            m.uniform_f64_rows(out, gens)
            ref = torch.stack([torch.empty(v, dtype=torch.float64).uniform_(generator=g) for g in refg])
            same_states = all(torch.equal(a.get_state(), b.get_state()) for a, b in zip(gens, refg))
            if not (torch.equal(out, ref) and same_states):
                bad += 1; print("BAD", v, seed, rep)
print("bad", bad)
gens = [torch.Generator().manual_seed(i) for i in range(16)]
u = torch.empty(16, 49152, dtype=torch.float64)
for th in (1, 2):
    torch.set_num_threads(th)
    m.uniform_f64_rows(u, gens); t0 = time.perf_counter()
    for _ in range(30): m.uniform_f64_rows(u, gens)
    print(th, "uniform_f64_rows ms", (time.perf_counter() - t0) / 30 * 1e3)
