"""Twenty-first session: int8 (W8A8, AMX) vs bf16 (AMX-BF16) products of SmolLM2 at 16 rows, each of the 30 layers' modules
in turn (the weights not all in cache), per layer call, at 1 and 2 threads. Usage: lin_micro.py ROWS"""
import sys, time, torch
from interq.models.pretrained import load_smollm2
from interq.quant import BF16_EXECUTOR, QuantConfig, make_executor
from interq.rollout import fast_layers as FL
learner, _ = load_smollm2(torch.bfloat16)
qi = make_executor(learner, QuantConfig()); qb = make_executor(learner, BF16_EXECUTOR)
li, lb = qi.model.layers[0], qb.model.layers[0]
rows = int(sys.argv[1]) if len(sys.argv) > 1 else 16
def t(f, x, n=300):
    for _ in range(20): f(x)
    best = 1e9
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n): f(x)
        best = min(best, (time.perf_counter() - t0) / n)
    return best * 1e6
def mods(l, name):
    a, m = l.self_attn, l.mlp
    return {"qkv": [a.q_proj, a.k_proj, a.v_proj], "o": [a.o_proj], "gate_up": [m.gate_proj, m.up_proj], "down": [m.down_proj]}[name]
names = [(n, k) for n, k in (("qkv", 576), ("o", 576), ("gate_up", 576), ("down", 1536))]
def chain(model, name):
    fs = [FL._project(mods(l, name)) for l in model.model.layers]
    return lambda x: [f(x) for f in fs]
for th in (1, 2):
    torch.set_num_threads(th)
    for name, k in names:
        x = torch.randn(rows, 1, k).bfloat16()
        fi, fb = chain(qi, name), chain(qb, name)
        with torch.no_grad():
            a, b = t(fi, x, 20) / 30, t(fb, x, 20) / 30
        print(f"threads {th} {name:8s} int8 {a:7.1f} us  bf16 {b:7.1f} us  bf16/int8 {b/a:5.2f}", flush=True)
