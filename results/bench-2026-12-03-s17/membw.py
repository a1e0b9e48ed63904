"""Seventeenth session: how fast this VM reads memory (a sum over 256 MB of bf16) and the rate at which SmolLM2's
lm_head weight (576 x 49,152 bf16, packed for oneDNN) streams through a 16-row product, 2 threads. Usage: membw.py"""
import time

import torch
from torch import nn

from interq.machine import describe, machine_info
from interq.quant.packed_linear import PackedBf16Linear

torch.set_num_threads(2)
print(describe(machine_info()), flush=True)
a = torch.ones(128 * 1024 * 1024, dtype=torch.bfloat16)  # 256 MB
for _ in range(3):
    t = time.perf_counter()
    a.sum()
    print(f"sum over 256 MB: {a.numel() * 2 / (time.perf_counter() - t) / 1e9:.1f} GB/s", flush=True)
lm_head = PackedBf16Linear.from_linear(nn.Linear(576, 49152, bias=False).bfloat16().requires_grad_(False))
x = torch.randn(16, 576).bfloat16()
with torch.inference_mode():
    lm_head(x)
    for _ in range(3):
        t = time.perf_counter()
        for _ in range(20):
            lm_head(x)
        dt = (time.perf_counter() - t) / 20
        print(f"lm_head, 16 rows: {dt * 1e3:.2f} ms per call = {576 * 49152 * 2 / dt / 1e9:.1f} GB/s of weight", flush=True)
