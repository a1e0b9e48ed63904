"""Does loading the CPU kernels built with -fopenmp slow the bf16 executor? Times SmolLM2 bf16-executor decode
(batch 1 and 16, 2 threads) in a process where the kernels are (a) not loaded (INTERQ_CPU_KERNELS=0), (b) loaded
as built now (-fopenmp), (c) loaded as built without -fopenmp; run each mode as its own process, interleaved.
Run: .venv/bin/python results/bench-2026-12-02-s13/omp_ab.py MODE   (MODE: none | omp | noomp)"""
import os, sys, time, statistics
mode = sys.argv[1]
if mode == "none":
    os.environ["INTERQ_CPU_KERNELS"] = "0"
import torch
from interq.quant import kernels
if mode == "omp":
    assert kernels.load() is not None
elif mode == "noomp":
    name, module = kernels._build(False, False)  # (a later refactor: _build returns its name with the module)
    kernels._STATE.update(module=module, tried=True, name=name)
torch.set_num_threads(2)
from interq.models.pretrained import load_smollm2
from interq.quant import make_executor
from interq.quant.config import BF16_EXECUTOR
from interq.quant.kv_cache import make_kv_cache
from interq.rollout.attention import set_rollout_attention
learner, _ = load_smollm2(torch.bfloat16)
exe = make_executor(learner, BF16_EXECUTOR)
set_rollout_attention(exe, "sdpa_packed")
def run(b, steps):
    prompt = torch.tensor([list(range(100, 116))] * b)
    cache = make_kv_cache(BF16_EXECUTOR, exe.config)
    out = exe(input_ids=prompt, cache=cache, use_cache=True)
    t = out.logits[:, -1].argmax(-1, keepdim=True)
    t0 = time.perf_counter()
    for _ in range(steps):
        out = exe(input_ids=t, cache=out.cache, use_cache=True)
        t = out.logits[:, -1].argmax(-1, keepdim=True)
    return (time.perf_counter() - t0) / steps
with torch.inference_mode():
    run(16, 4)
    res = {b: statistics.median(run(b, 32) for _ in range(3)) for b in (1, 16)}
gomp = sorted({l.split()[-1] for l in open("/proc/self/maps") if "gomp" in l})
print(f"{mode:6s} bs1 {1 / res[1]:6.1f} tok/s  bs16 {16 / res[16]:6.1f} tok/s  kernels {kernels.status()['name']}  gomp {gomp}", flush=True)
