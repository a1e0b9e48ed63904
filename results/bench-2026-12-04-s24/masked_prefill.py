"""Twenty-fourth session: rollout.attention=packed_kernel's masked prefill (interq's masked_attention) against the
session start's build (path given) and torch's sdpa (sdpa_packed's masked prefill: enable_gqa, the bool mask), at an
RL-step-shaped prefill: 8 rows x 280 new tokens over 1,000 / 2,000 cached + new keys, 9 heads, 3 KV heads, D 64,
bf16, rows padded on the left by 0-300 keys; one thread, interleaved, medians of 5.

    .venv/bin/python results/bench-2026-12-04-s24/masked_prefill.py OLD_SO
"""
import importlib.util, statistics, sys, time, torch
import torch.nn.functional as F
from interq.quant import kernels

spec = importlib.util.spec_from_file_location(sys.argv[1].rsplit("/", 1)[1].split(".")[0], sys.argv[1])
old = importlib.util.module_from_spec(spec); spec.loader.exec_module(old)
new = kernels.load()
torch.set_num_threads(1)
g = torch.Generator().manual_seed(0)
for lk in (1000, 2000):
    b, h, hkv, lq, d = 8, 9, 3, 280, 64
    q = torch.randn(b, h, lq, d, generator=g).bfloat16(); k = torch.randn(b, hkv, lk, d, generator=g).bfloat16(); v = torch.randn(b, hkv, lk, d, generator=g).bfloat16()
    pad = torch.randint(0, 300, (b,), generator=g)
    col = torch.arange(lk); rowq = torch.arange(lq) + lk - lq
    mask = (col[None, None, :] <= rowq[None, :, None]) & (col[None, None, :] >= pad[:, None, None])  # [B, Lq, Lk]
    mask = mask[:, None]  # [B, 1, Lq, Lk]
    fs = {"torch_sdpa": lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.125, enable_gqa=True),
          "old": lambda: old.masked_attention(q, k, v, mask, 0.125), "new": lambda: new.masked_attention(q, k, v, mask, 0.125)}
    ts = {n: [] for n in fs}
    for f in fs.values(): f()
    for _ in range(5):
        for n, f in fs.items():
            t0 = time.perf_counter(); f(); ts[n].append((time.perf_counter() - t0) * 1e3)
    m = {n: statistics.median(t) for n, t in ts.items()}
    same = torch.equal(old.masked_attention(q, k, v, mask, 0.125).view(torch.int16), new.masked_attention(q, k, v, mask, 0.125).view(torch.int16))
    print(f"lk={lk}: torch sdpa {m['torch_sdpa']:.1f} ms, kernel at the start {m['old']:.1f}, now {m['new']:.1f} "
          f"({m['old']/m['new']:.2f}x the start, {m['torch_sdpa']/m['new']:.2f}x torch); same bits as the start: {same}", flush=True)
