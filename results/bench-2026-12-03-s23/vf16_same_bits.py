"""Twenty-third session: the AVX2 vf16 (two __m256) against the generic 64-byte vectors it replaced on AVX2 builds:
load the kernels built from 59fa1ba (the session's start, generic vectors; path given) and from this tree side by
side and compare the fp32 attention kernels' outputs bit for bit.

    .venv/bin/python results/bench-2026-12-03-s23/vf16_same_bits.py OLD_SO
"""
import importlib.util, sys, torch
from interq.quant import kernels

def load(path):
    name = path.rsplit("/", 1)[1].split(".")[0]
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
    return mod

old, new = load(sys.argv[1]), kernels.load()
print("old", sys.argv[1].rsplit("/", 1)[1], "new", new.__name__)
g = torch.Generator().manual_seed(0)
bad = 0
for threads in (1, 2):
    torch.set_num_threads(threads)
    for (b, h, hkv, l, d) in [(1, 9, 3, 300, 64), (2, 4, 2, 77, 32), (1, 2, 1, 130, 128), (1, 6, 3, 65, 16)]:
        q = torch.randn(b, h, l, d, generator=g); k = torch.randn(b, hkv, l, d, generator=g); v = torch.randn(b, hkv, l, d, generator=g)
        o1, s1 = old.causal_attention_fwd(q, k, v, d ** -0.5); o2, s2 = new.causal_attention_fwd(q, k, v, d ** -0.5)
        do = torch.randn_like(o1)
        g1 = old.causal_attention_bwd(q, k, v, o1, s1, do, d ** -0.5); g2 = new.causal_attention_bwd(q, k, v, o2, s2, do, d ** -0.5)
        same = torch.equal(o1, o2) and torch.equal(s1, s2) and all(torch.equal(x, y) for x, y in zip(g1, g2))
        bad += not same
        print(f"threads {threads} causal fwd/bwd {(b, h, hkv, l, d)}: same bits {same}")
        for dt in (torch.float32, torch.bfloat16):
            G = h // hkv
            qd = torch.randn(b, hkv, G, d, generator=g).to(dt); kd = torch.randn(b, hkv, l, d, generator=g).to(dt); vd = torch.randn(b, hkv, l, d, generator=g).to(dt)
            mask = torch.rand(b, 1, 1, l, generator=g) > 0.2
            for m in (None, mask, torch.where(mask, 0.0, float("-inf")).to(dt)):
                s = torch.equal(old.decode_attention(qd, kd, vd, m, 0.125), new.decode_attention(qd, kd, vd, m, 0.125))
                bad += not s
            lq = 5
            qp = torch.randn(b, h, lq, d, generator=g).to(dt)
            pm = torch.ones(b, 1, lq, l, dtype=torch.bool).tril(l - lq); pm[:, :, :, :3] = False
            for m in (pm, torch.where(pm, 0.0, float("-inf")).to(dt)):
                s = torch.equal(old.masked_attention(qp, kd, vd, m, 0.125), new.masked_attention(qp, kd, vd, m, 0.125))
                bad += not s
        print(f"threads {threads} decode / masked attention {(b, h, hkv, l, d)}: mismatching calls so far {bad}")
print("RESULT", {"mismatching_calls": bad})
