"""The learner's causal attention: interq's kernel (train.learner_attention=kernel) against torch's CPU flash kernel
(F.scaled_dot_product_attention, is_causal, enable_gqa), forward and forward+backward, SmolLM2's heads (9 query, 3 KV,
D 64), fp32; error of each against float64. Fourteenth session. Usage: learner_attn.py [L ...]"""
import sys, time
import torch
import torch.nn.functional as F
from interq.train.learner_attention import causal_attention

torch.manual_seed(0)
def ref(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).transpose(1, 2)

def timed(fn, reps):
    best = 1e9
    for _ in range(reps):
        t0 = time.perf_counter(); fn(); best = min(best, time.perf_counter() - t0)
    return best * 1e3

print(f"threads {torch.get_num_threads()}")
for L in [int(x) for x in sys.argv[1:]] or [100, 700, 1760]:
    q = torch.randn(1, 9, L, 64); k = torch.randn(1, 3, L, 64); v = torch.randn(1, 3, L, 64)
    do = torch.randn(1, L, 9, 64)
    errs = {}
    outs = {}
    for name, fn in (("torch", ref), ("kernel", causal_attention), ("f64", ref)):
        dt = torch.float64 if name == "f64" else torch.float32
        qq, kk, vv = (t.detach().to(dt).clone().requires_grad_() for t in (q, k, v))
        o = fn(qq, kk, vv)
        o.backward(do.to(dt))
        outs[name] = [o.detach().double(), qq.grad.double(), kk.grad.double(), vv.grad.double()]
    for name in ("torch", "kernel"):
        errs[name] = [float((a - b).abs().max() / b.abs().max()) for a, b in zip(outs[name], outs["f64"])]
    reps = 3 if L > 1000 else 5
    tf = {n: timed(lambda: fn(q, k, v), reps) for n, fn in (("torch", ref), ("kernel", causal_attention))}
    def fb(fn):
        qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
        fn(qq, kk, vv).backward(do)
    tb = {n: timed(lambda: fb(fn), reps) for n, fn in (("torch", ref), ("kernel", causal_attention))}
    print(f"L={L}: fwd torch {tf['torch']:.1f} ms, kernel {tf['kernel']:.1f} ms ({tf['torch']/tf['kernel']:.2f}x); "
          f"fwd+bwd torch {tb['torch']:.1f} ms, kernel {tb['kernel']:.1f} ms ({tb['torch']/tb['kernel']:.2f}x)")
    print(f"   error vs float64 (max |diff| / max |ref|) out, dq, dk, dv: torch {['%.1e' % e for e in errs['torch']]} "
          f"kernel {['%.1e' % e for e in errs['kernel']]}")
