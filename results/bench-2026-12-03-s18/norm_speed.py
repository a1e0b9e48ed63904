"""Eighteenth session: transformers' LlamaRMSNorm (eager) against interq's FusedRMSNorm per call, bf16, 2 threads,
at 16 x 1, 656 and 2,048 rows of 576. Usage: norm_speed.py"""
import time, torch
from transformers.models.llama.modeling_llama import LlamaRMSNorm
from interq.quant.rms_norm import FusedRMSNorm
torch.set_num_threads(2)
norm = LlamaRMSNorm(576, 1e-5).to(torch.bfloat16); fused = FusedRMSNorm.from_norm(norm)
def hot(f, n=200):
    f(); best = 1e9
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(n): f()
        best = min(best, (time.perf_counter() - t) / n)
    return best * 1e6
with torch.no_grad():
    for shape in [(16, 1, 576), (656, 576), (2048, 576)]:
        x = torch.randn(*shape).bfloat16()
        print(shape, f"eager {hot(lambda: norm(x)):.1f} us, fused {hot(lambda: fused(x)):.1f} us")
