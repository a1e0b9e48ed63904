"""Twenty-fourth session: the AVX2 attention tiles (6 x 16 and 5 x 16 register tiles, K^T packed by blocks, 64-byte
work buffers, a vector hmax, no exp call where the row maximum did not move) against the kernels of the session's
start (de3cd94, path given), bit for bit (int32 views: a -0 against +0 or another NaN payload counts), over the learner's
causal forward / backward, the packed decode and the masked prefill (fp32 / bf16, bool / additive masks, 1 and 2
threads, D 16-128), with ordinary inputs and with zeros, -0 and huge values mixed in.

    .venv/bin/python results/bench-2026-12-04-s24/attention_same_bits.py OLD_SO [NEW_SO]   (NEW_SO: this tree's own build)
"""
import importlib.util, sys, torch
from interq.quant import kernels


def load(path):
    name = path.rsplit("/", 1)[1].split(".")[0]
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
    return mod


def bits(t):
    return t.contiguous().view(torch.int16 if t.dtype == torch.bfloat16 else torch.int32)


def same(a, b):
    a = a if isinstance(a, (list, tuple)) else [a]
    b = b if isinstance(b, (list, tuple)) else [b]
    return all(torch.equal(bits(x), bits(y)) for x, y in zip(a, b))


def rough(shape, g, special):
    x = torch.randn(*shape, generator=g)
    if special:  # zeros, negative zeros and large values in places
        r = torch.rand(*shape, generator=g)
        x = torch.where(r < 0.05, torch.zeros_like(x), x)
        x = torch.where((r >= 0.05) & (r < 0.1), -torch.zeros_like(x), x)
        x = torch.where(r > 0.995, x * 40, x)
    return x


old, new = load(sys.argv[1]), (load(sys.argv[2]) if len(sys.argv) > 2 else kernels.load())
print("old", sys.argv[1].rsplit("/", 1)[1], "new", new.__name__)
g = torch.Generator().manual_seed(0)
bad = calls = 0
for threads in (1, 2):
    torch.set_num_threads(threads)
    for special in (False, True):
        for (b, h, hkv, l, d) in [(1, 9, 3, 300, 64), (2, 4, 2, 77, 32), (1, 2, 1, 130, 128), (1, 6, 3, 65, 16), (1, 3, 1, 1030, 64)]:
            q, k, v = rough((b, h, l, d), g, special), rough((b, hkv, l, d), g, special), rough((b, hkv, l, d), g, special)
            o1, s1 = old.causal_attention_fwd(q, k, v, d ** -0.5); o2, s2 = new.causal_attention_fwd(q, k, v, d ** -0.5)
            do = rough(tuple(o1.shape), g, special)
            g1 = old.causal_attention_bwd(q, k, v, o1, s1, do, d ** -0.5); g2 = new.causal_attention_bwd(q, k, v, o2, s2, do, d ** -0.5)
            ok = same([o1, s1, *g1], [o2, s2, *g2]); bad += not ok; calls += 2
            print(f"threads {threads} special {special} causal fwd/bwd {(b, h, hkv, l, d)}: same bits {ok}", flush=True)
            for dt in (torch.float32, torch.bfloat16):
                G = h // hkv
                qd, kd, vd = (rough(s, g, special).to(dt) for s in ((b, hkv, G, d), (b, hkv, l, d), (b, hkv, l, d)))
                mask = torch.rand(b, 1, 1, l, generator=g) > 0.2
                for m in (None, mask, torch.where(mask, 0.0, float("-inf")).to(dt)):
                    ok = same(old.decode_attention(qd, kd, vd, m, 0.125), new.decode_attention(qd, kd, vd, m, 0.125))
                    bad += not ok; calls += 1
                for lq in (5, 70):
                    qp = rough((b, h, lq, d), g, special).to(dt)
                    pm = torch.ones(b, 1, lq, l, dtype=torch.bool).tril(l - lq); pm[:, :, :, :3] = False
                    for m in (pm, torch.where(pm, 0.0, float("-inf")).to(dt)):
                        ok = same(old.masked_attention(qp, kd, vd, m, 0.125), new.masked_attention(qp, kd, vd, m, 0.125))
                        bad += not ok; calls += 1
            print(f"threads {threads} special {special} decode / masked {(b, h, hkv, l, d)}: mismatching calls so far {bad}", flush=True)
print("RESULT", {"calls": calls, "mismatching_calls": bad})
