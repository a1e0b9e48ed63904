"""Twenty-fourth session: the learner's causal attention kernels of this tree against another build (argv[1]: the session
start's .so), SmolLM2 shapes (9 heads, 3 KV heads, D 64), fp32, one thread; same bits checked, then interleaved medians of 7.

    .venv/bin/python results/bench-2026-12-04-s24/attention_ab.py OLD_SO
"""
# A/B of the learner attention kernels: this build against another .so (argv[1]); same inputs, same bits?
import sys, time, statistics, torch, importlib.util
REPS = 7
from interq.train import learner_attention as la
torch.set_num_threads(int(sys.argv[2]) if len(sys.argv) > 2 else 1)
new = la._module()
spec = importlib.util.spec_from_file_location(sys.argv[1].rsplit("/", 1)[1].split(".")[0], sys.argv[1])
old = importlib.util.module_from_spec(spec); spec.loader.exec_module(old)
def best(f, n=4):
    f(); b = 1e9
    for _ in range(n):
        t0 = time.perf_counter(); f(); b = min(b, time.perf_counter() - t0)
    return b * 1e3
for L in (300, 1000, 1760, 2500):
    g = torch.Generator().manual_seed(L)
    q = torch.randn(1, 9, L, 64, generator=g); k = torch.randn(1, 3, L, 64, generator=g); v = torch.randn(1, 3, L, 64, generator=g)
    o1, l1 = new.causal_attention_fwd(q, k, v, 0.125); o0, l0 = old.causal_attention_fwd(q, k, v, 0.125)
    dout = torch.randn(o1.shape, generator=g)
    g1 = new.causal_attention_bwd(q, k, v, o1, l1, dout, 0.125); g0 = old.causal_attention_bwd(q, k, v, o0, l0, dout, 0.125)
    same = all(torch.equal(a.view(torch.int32), b.view(torch.int32)) for a, b in zip((o1, l1, *g1), (o0, l0, *g0)))
    r = {"old": ([], []), "new": ([], [])}
    for _ in range(REPS):  # interleaved, medians: this VM's speed moves within seconds
        for name, m in (("old", old), ("new", new)):
            for i, f in enumerate((lambda: m.causal_attention_fwd(q, k, v, 0.125), lambda: m.causal_attention_bwd(q, k, v, o1, l1, dout, 0.125))):
                t0 = time.perf_counter(); f(); r[name][i].append((time.perf_counter() - t0) * 1e3)
    r = {n: tuple(statistics.median(x) for x in v) for n, v in r.items()}
    print(f"L={L}: same bits {same}; median of 7, fwd old {r['old'][0]:.1f} new {r['new'][0]:.1f} ms ({r['old'][0]/r['new'][0]:.2f}x); "
          f"bwd old {r['old'][1]:.1f} new {r['new'][1]:.1f} ms ({r['old'][1]/r['new'][1]:.2f}x)", flush=True)
