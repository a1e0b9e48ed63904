"""Twenty-first session: SmolLM2's products at prefill sizes (M rows, one thread): the W8A8 kernel (int8_linear_amx,
activation quantization, AMX int8 GEMM and epilogue in one call) against the bf16 F.linear (oneDNN) the bf16
executor runs over 256 rows, and the int8 kernel's parts (quant_act_int8 alone). Usage: prefill_linear_micro.py M"""
import sys, time, torch
from interq.models.pretrained import load_smollm2
from interq.quant import QuantConfig, make_executor, kernels
from interq.rollout import fast_layers as FL
torch.set_num_threads(1)
learner, _ = load_smollm2(torch.bfloat16)
qi = make_executor(learner, QuantConfig())
li, lb = qi.model.layers[0], learner.model.layers[0]
mod = kernels.get()
m = int(sys.argv[1]) if len(sys.argv) > 1 else 2240
def t(f, n=5):
    f()
    best = 1e9
    for _ in range(n):
        t0 = time.perf_counter(); f(); best = min(best, time.perf_counter() - t0)
    return best * 1e3
rows = []
for name, mi, mb, k in (("qkv", [li.self_attn.q_proj, li.self_attn.k_proj, li.self_attn.v_proj], [lb.self_attn.q_proj, lb.self_attn.k_proj, lb.self_attn.v_proj], 576),
                        ("o", [li.self_attn.o_proj], [lb.self_attn.o_proj], 576),
                        ("gate_up", [li.mlp.gate_proj, li.mlp.up_proj], [lb.mlp.gate_proj, lb.mlp.up_proj], 576),
                        ("down", [li.mlp.down_proj], [lb.mlp.down_proj], 1536)):
    x = torch.randn(m, k).bfloat16()
    fi = FL._project(mi)
    n_out = sum(mm.out_features for mm in mb)
    with torch.no_grad():
        a = t(lambda: fi(x))
        b = t(lambda: [torch.nn.functional.linear(x, mm.weight) for mm in mb])
        q = t(lambda: mod.quant_act_int8(x, 127))
    gops = 2 * m * k * n_out / 1e9
    print(f"M {m} {name:8s} int8 kernel {a:7.2f} ms ({gops / a * 1e3:5.0f} GOP/s)  bf16 F.linear {b:7.2f} ms ({gops / b * 1e3:5.0f})"
          f"  quant_act_int8 alone {q:5.2f} ms", flush=True)
