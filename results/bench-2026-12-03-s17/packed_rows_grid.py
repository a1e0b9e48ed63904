"""Seventeenth session: does the oneDNN-packed bf16 product (PackedBf16Linear's, packed for 16 rows) equal F.linear's
bit for bit above 256 rows? Every row count 1-1,100 for SmolLM2-135M's linear shapes, tiny-qwen3's and one more, 1 and 2
threads, random inputs. Usage: packed_rows_grid.py [MAX_ROWS]"""
import sys
import time

import torch
import torch.nn.functional as F

from interq.machine import describe, machine_info
from interq.quant.packed_linear import _pack

max_rows = int(sys.argv[1]) if len(sys.argv) > 1 else 1100
print(describe(machine_info()), flush=True)
shapes = [(576, 576), (576, 192), (576, 1536), (1536, 576), (256, 768), (768, 256), (1024, 1024)]
g = torch.Generator().manual_seed(0)
t0 = time.time()
for threads in (1, 2):
    torch.set_num_threads(threads)
    for k, n in shapes:
        w = (torch.randn(n, k, generator=g) / k ** 0.5).bfloat16()
        b = torch.randn(n, generator=g).bfloat16()
        pw = _pack(w)
        x_all = torch.randn(max_rows, k, generator=g).bfloat16()
        bad = []
        with torch.inference_mode():
            for m in range(1, max_rows + 1):
                x = x_all[:m].contiguous()
                for bias in (None, b):
                    ref = F.linear(x, w, bias)
                    got = torch.ops.mkldnn._linear_pointwise(x, pw, bias, "none", [], "")
                    if not torch.equal(ref, got):
                        bad.append((m, bias is not None))
        print(f"threads {threads} K={k} N={n}: {len(bad)} of {2 * max_rows} differ"
              + (f" (first rows: {bad[:8]})" if bad else ""), flush=True)
print(f"done in {time.time() - t0:.0f} s")
