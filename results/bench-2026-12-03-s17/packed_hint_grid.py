"""Seventeenth session: which oneDNN pack (the row-count hint given to _reorder_linear_weight) reproduces F.linear's
bf16 product above 256 rows, at 2 threads (where the pack for 16 rows does not: packed_rows_grid.log)? Every row count
257-1,100, no bias, SmolLM2-135M's shapes and two more. Usage: packed_hint_grid.py [THREADS]"""
import sys
import time

import torch
import torch.nn.functional as F

from interq.machine import describe, machine_info

threads = int(sys.argv[1]) if len(sys.argv) > 1 else 2
torch.set_num_threads(threads)
print(describe(machine_info()), flush=True)
shapes = [(576, 576), (576, 192), (1536, 576), (576, 1536), (768, 256), (1024, 1024)]
hints = (16, 256, 512, 1024)
g = torch.Generator().manual_seed(0)
t0 = time.time()
for k, n in shapes:
    w = (torch.randn(n, k, generator=g) / k ** 0.5).bfloat16()
    packs = {h: torch.ops.mkldnn._reorder_linear_weight(w, h) for h in hints}
    x_all = torch.randn(1100, k, generator=g).bfloat16()
    bad = {h: [] for h in hints}
    with torch.inference_mode():
        for m in range(257, 1101):
            x = x_all[:m].contiguous()
            ref = F.linear(x, w)
            for h, pw in packs.items():
                if not torch.equal(ref, torch.ops.mkldnn._linear_pointwise(x, pw, None, "none", [], "")):
                    bad[h].append(m)
    print(f"K={k} N={n}: " + ", ".join(f"hint {h}: {len(b)} of 844 differ" + (f" (from {b[0]})" if b else "")
                                       for h, b in bad.items()), flush=True)
print(f"done in {time.time() - t0:.0f} s")
