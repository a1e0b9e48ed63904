"""Twentieth session: what one small eager op or view costs on this VM (us per call, best of 5 x 5,000, one thread):
the KV buffer's views and copy at SmolLM2's decode shapes, and a tiny add."""
import time

import torch

torch.set_num_threads(1)
buf = torch.empty(16, 3, 104, 64, dtype=torch.bfloat16)
k = torch.randn(16, 3, 1, 64).bfloat16()
x = torch.ones(4)


def t(f, n=5000):
    for _ in range(200):
        f()
    best = 1e9
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            f()
        best = min(best, (time.perf_counter() - t0) / n * 1e6)
    return best


dst = buf.narrow(-2, 40, 1)
for name, f in (("buf[..., :41, :]", lambda: buf[..., :41, :]), ("buf.narrow(-2, 0, 41)", lambda: buf.narrow(-2, 0, 41)),
                ("buf.view(-1)", lambda: buf.view(-1)), ("narrow(...).copy_(new)", lambda: dst.copy_(k)),
                ("x + x (4 floats)", lambda: x + x)):
    print(f"{name:26s} {t(f):6.2f} us")
