"""Learner throughput: tokens/s of the learner's forward+backward, plain and aligned, fp32, bf16
autocast and bf16 backward, on SmolLM2-135M-Instruct and on the tiny household policy.

What is timed is what ``interq.train.rl.update`` runs per micro-batch: ``sequence_logprobs`` with ``score_mask`` =
the action tokens (the lm-head only where an action is scored), inside ``interq.quant.aligned`` for the aligned
learner (q-align / q-interq), then the decoupled PPO loss (``interq.algo.loss.ppo_loss``) and ``backward``; and,
separately, the no-grad forward of the proximal pass (``rl.proximal_logprobs``). Rows are concatenated episodes:
``--turns`` turns of ``--obs-tokens`` observation tokens then ``--act-tokens`` action tokens, random token ids.

Arms run side by side in interleaved rounds; each time is the median over rounds (``fwd_bwd_tokens_per_s``) and
the fastest round (``..._best``, the least disturbed by other jobs on a shared machine), and the process CPU seconds
of each pass (``fwd_bwd_cpu_s``, median; all threads). Two bf16 modes
(``train.learner_autocast``), each timed only where bf16 is native (``interq.machine.bf16_native``: AVX512_BF16/AMX
CPUs, CUDA sm >= 8.0) or with ``--bf16 on``: ``*_bf16``, ``torch.autocast(device, torch.bfloat16)`` around the
forward, and ``*_bf16bwd``, the fp32 forward with the linear layers' backward GEMMs in bf16
(``interq.train.bf16_backward``); fp32 master weights and fp32 gradients in both. Their numerics against fp32 on
the same batch are reported: relative L2 error and cosine of the whole gradient, |delta| of the action-token
log-probs (0 for ``bf16bwd``).

The header and the RESULT line record the machine (``machine``: ``interq.machine.machine_info()`` at the start,
``load_avg_end`` at the end; thread count included). On CPU the arm ``aligned_fp32_eager`` is the aligned learner
without the fused CPU kernels (``interq.kernels``; the same numbers): ``kernels_over_eager_aligned_fp32``.
Every arm's causal attention is ``--learner-attention`` (``train.learner_attention``: ``auto`` as a run's config
resolves it on this machine, ``sdpa`` or ``kernel``), recorded as ``learner_attention``.
Ends with ``RESULT {json}``.

    nice -n 5 .venv/bin/python benchmarks/bench_learner.py [--threads 2] [--device cpu] [--skip-smollm2] [--learner-attention sdpa]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from interq.algo.loss import ppo_loss
from interq.machine import bf16_native, describe, load_avg, machine_info, resolve_device, synchronize
from interq import kernels
from interq.quant import QuantConfig
from interq.rollout import sequence_logprobs
from interq.train.rl import learner_context


# arm suffix -> train.learner_autocast: fp32, bf16 autocast of the forward, fp32 forward with bf16 backward GEMMs
PRECISIONS = {"fp32": "off", "bf16": "bf16", "bf16bwd": "bf16_backward"}


def make_rows(vocab: int, rows: int, turns: int, obs_tokens: int, act_tokens: int, seed: int = 0):
    """Concatenated-layout rows: per turn ``obs_tokens`` observation tokens then ``act_tokens`` action tokens."""
    g = torch.Generator().manual_seed(seed)
    per = obs_tokens + act_tokens
    ids = torch.randint(10, vocab - 10, (rows, turns * per), generator=g)  # [R, L]
    col = torch.arange(turns * per)
    action = (col % per) >= obs_tokens  # [L]
    return ids, torch.ones_like(ids), action[None, :].expand(rows, -1).clone()  # [R, L], [R, L], [R, L] bool


def learner_pass(model, ids, mask, act, align: bool, qcfg: QuantConfig, autocast: str = "off",
                 backward: bool = True, attention: str = "sdpa") -> torch.Tensor:
    """One micro-batch as ``rl.update`` runs it: current log-probs [R, L] (+ PPO loss and backward when ``backward``).
    ``autocast``: ``train.learner_autocast`` (off | bf16 | bf16_backward); ``attention``: ``train.learner_attention``."""
    ctx = learner_context(model, align, qcfg, autocast, attention=attention)  # the trainer's learner context
    grad = torch.enable_grad() if backward else torch.no_grad()
    with grad, ctx:  # the backward too, as rl.update: checkpointed layers recompute the same (aligned) forward
        current = sequence_logprobs(model, ids, mask, temperature=1.0, score_mask=act)  # [R, L] fp32
        if backward:
            adv = torch.where(act, torch.ones_like(current), torch.zeros_like(current))  # [R, L]
            loss, _ = ppo_loss(current, current.detach(), adv, None, act, eps_low=0.2, eps_high=0.28,
                               num_tokens=int(act.sum()))
            loss.backward()
    return current.detach()


def grad_vector(model) -> torch.Tensor:
    return torch.cat([p.grad.reshape(-1).double() for p in model.parameters() if p.grad is not None])  # [P] float64


def bench_model(name: str, model, args, device: torch.device, use_bf16: bool) -> dict:
    qcfg = QuantConfig()
    model = model.to(device).float()  # fp32 master weights, as the learner keeps
    model.train()
    ids, mask, act = make_rows(model.config.vocab_size, args.rows if name != "tiny" else args.tiny_rows, args.turns,
                               args.obs_tokens, args.act_tokens)
    ids, mask, act = ids.to(device), mask.to(device), act.to(device)
    tokens = int(mask.sum())
    label = lambda al, pr, eg=False: f"{'aligned' if al else 'plain'}_{pr}" + ("_eager" if eg else "")  # noqa: E731
    arms = [(al, pr, False) for al in (False, True) for pr in (PRECISIONS if use_bf16 else ("fp32",))
            if args.arms is None or label(al, pr) in args.arms]
    # the aligned learner without the fused CPU kernels (interq.kernels): the same numbers, eager ops
    if device.type == "cpu" and (args.arms is None or "aligned_fp32_eager" in args.arms):
        arms.append((True, "fp32", True))
    # warm-up (allocator, lazy init), one small pass per arm
    w = 2 * (args.obs_tokens + args.act_tokens)  # two turns of one row
    for al, pr, eg in arms:
        kernels.set_enabled(not eg)
        model.zero_grad(set_to_none=True)
        learner_pass(model, ids[:1, :w], mask[:1, :w], act[:1, :w], al, qcfg, PRECISIONS[pr],
                     attention="sdpa" if eg else args.learner_attention)
    fb = {label(*a): [] for a in arms}
    fb_cpu = {label(*a): [] for a in arms}  # process CPU seconds of the same passes: steadier than wall time when shared
    fwd = {label(*a): [] for a in arms}
    numerics: dict = {}
    ref: dict = {}
    for rnd in range(args.rounds):
        for al, pr, eg in arms:
            k = label(al, pr, eg)
            kernels.set_enabled(not eg)
            model.zero_grad(set_to_none=True)
            synchronize(device)
            t0, c0 = time.perf_counter(), time.process_time()
            lp = learner_pass(model, ids, mask, act, al, qcfg, PRECISIONS[pr],
                              attention="sdpa" if eg else args.learner_attention)
            synchronize(device)
            fb[k].append(time.perf_counter() - t0)
            fb_cpu[k].append(time.process_time() - c0)
            if rnd == 0 and not eg:  # numerics of the bf16 modes against fp32, same batch, same align mode
                g = grad_vector(model)
                if pr == "fp32":
                    ref[al] = (g, lp)
                else:
                    g32, lp32 = ref[al]
                    d = (lp - lp32)[act].abs()  # [A]
                    numerics[k] = {"grad_rel_l2": round(float((g - g32).norm() / g32.norm()), 5),
                                   "grad_cosine": round(float(torch.nn.functional.cosine_similarity(g, g32, dim=0)), 6),
                                   "logprob_abs_delta_mean": round(float(d.mean()), 5),
                                   "logprob_abs_delta_max": round(float(d.max()), 4)}
            model.zero_grad(set_to_none=True)
            if args.skip_forward_only:
                continue
            synchronize(device)
            t0 = time.perf_counter()
            learner_pass(model, ids, mask, act, al, qcfg, PRECISIONS[pr], backward=False,
                         attention="sdpa" if eg else args.learner_attention)
            synchronize(device)
            fwd[k].append(time.perf_counter() - t0)
        print(f"[{name}] round {rnd + 1}/{args.rounds}: " + ", ".join(f"{k} {fb[k][-1]:.2f}s ({fb_cpu[k][-1]:.1f} CPU s)"
                                                                       for k in fb), flush=True)
    kernels.set_enabled(True)
    ref.clear()
    model.zero_grad(set_to_none=True)
    res = {"model": name, "params": sum(p.numel() for p in model.parameters()), "rows": int(ids.shape[0]),
           "tokens_per_pass": tokens, "action_tokens_per_pass": int(act.sum()),
           "fwd_bwd_tokens_per_s": {k: round(tokens / statistics.median(v), 1) for k, v in fb.items()},
           # fastest round: the least disturbed by other jobs on a shared machine
           "fwd_bwd_tokens_per_s_best": {k: round(tokens / min(v), 1) for k, v in fb.items()},
           "fwd_only_tokens_per_s": {k: round(tokens / statistics.median(v), 1) for k, v in fwd.items() if v},
           "fwd_bwd_cpu_s": {k: round(statistics.median(v), 2) for k, v in fb_cpu.items()},
           "bf16_vs_fp32_numerics": numerics}
    s = res["fwd_bwd_tokens_per_s"]
    for key, num, den in (("aligned_over_plain_fp32", "aligned_fp32", "plain_fp32"),
                          ("bf16_over_fp32_plain", "plain_bf16", "plain_fp32"),
                          ("bf16_over_fp32_aligned", "aligned_bf16", "aligned_fp32"),
                          ("bf16bwd_over_fp32_plain", "plain_bf16bwd", "plain_fp32"),
                          ("bf16bwd_over_fp32_aligned", "aligned_bf16bwd", "aligned_fp32"),
                          ("kernels_over_eager_aligned_fp32", "aligned_fp32", "aligned_fp32_eager")):
        if num in s and den in s:
            res[key] = round(s[num] / s[den], 3)
            best = res["fwd_bwd_tokens_per_s_best"]
            res[key + "_best"] = round(best[num] / best[den], 3)
    print(f"[{name}] {tokens} tokens/pass ({res['action_tokens_per_pass']} action); forward+backward tokens/s {s}; "
          f"forward only {res['fwd_only_tokens_per_s']}", flush=True)
    for k, v in numerics.items():
        print(f"[{name}] {k} vs fp32: {v}", flush=True)
    return res


def tiny_policy():
    """The household preset's tiny policy: its tokenizer trained on 64 expert household episodes, as the warm start
    (``interq.train.pipeline.prepare_policy``) builds it; weights freshly initialised (speed does not depend on them)."""
    from interq.agent.loop import make_render
    from interq.train.build import collect_demos, demo_texts, env_factory, split_tasks
    from interq.train.config import build_config
    from interq.train.policy import build_tiny_policy

    cfg = build_config("household", [])
    make_env = env_factory(cfg.env)
    train_tasks, _ = split_tasks(make_env, cfg.env)
    by_index = cfg.env.action_format == "index"
    demos = collect_demos(make_env, train_tasks, 64, 0.0, 1, cfg.env.max_turns, cfg.algo.layout,
                          cfg.rollout.history_turns, make_render(cfg.env.show_admissible, by_index), by_index)
    return build_tiny_policy(cfg.model, demo_texts(demos))[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu", help="cpu (default), cuda or auto (cuda when a GPU is visible)")
    ap.add_argument("--bf16", default="auto", choices=["auto", "on", "off"],
                    help="time the bf16 arms (autocast, bf16 backward): auto = where bf16 is native (default), on, off")
    ap.add_argument("--rows", type=int, default=1, help="SmolLM2 rows per pass (one micro-batch)")
    ap.add_argument("--tiny-rows", type=int, default=16, help="tiny-policy rows per pass")
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--obs-tokens", type=int, default=96)
    ap.add_argument("--act-tokens", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--step-tokens", type=int, default=13_000,
                    help="tokens of one SmolLM2 RL step (8 episodes x 9-10 turns, concatenated) for the step estimate")
    ap.add_argument("--learner-attention", default="auto", choices=["auto", "sdpa", "kernel"],
                    help="train.learner_attention of every arm: auto (as a run's config resolves it here), sdpa "
                    "(torch's flash kernel) or kernel (interq's)")
    ap.add_argument("--skip-smollm2", action="store_true")
    ap.add_argument("--skip-tiny", action="store_true")
    ap.add_argument("--skip-forward-only", action="store_true", help="do not time the no-grad (proximal pass) forward")
    ap.add_argument("--arms", type=lambda v: v.split(","), default=None,
                    help="comma-separated subset of {plain,aligned}_{fp32,bf16,bf16bwd} and aligned_fp32_eager "
                    "(the aligned learner without the fused CPU kernels) (default: all)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    try:
        dev = resolve_device(args.device, "--device")
    except ValueError as e:
        ap.error(str(e))
    use_bf16 = {"auto": bf16_native(dev), "on": True, "off": False}[args.bf16]
    arm_names = (*(f"{al}_{pr}" for al in ("plain", "aligned") for pr in PRECISIONS), "aligned_fp32_eager")
    if args.arms is not None and (bad := [a for a in args.arms if a not in arm_names]):
        ap.error(f"--arms: {bad} not accepted; accepted: {','.join(arm_names)}")
    from interq.train.config import resolve_learner_attention

    args.learner_attention = resolve_learner_attention(args.learner_attention, str(dev))
    machine = machine_info(dev)  # at the start; load_avg_end added at the end
    print(f"bench_learner {time.strftime('%Y-%m-%d %H:%M')} on {describe(machine)}; bf16 arms: {use_bf16}; "
          f"learner attention: {args.learner_attention}", flush=True)
    result: dict = {"device": str(dev), "threads": args.threads, "bf16_native": bf16_native(dev), "bf16_timed": use_bf16,
                    "learner_attention": args.learner_attention, "shape": {"turns": args.turns, "obs_tokens": args.obs_tokens, "act_tokens": args.act_tokens},
                    "machine": machine}
    if not args.skip_smollm2:
        from interq.models.pretrained import load_smollm2

        torch.manual_seed(0)
        result["smollm2"] = bench_model("smollm2", load_smollm2(torch.float32)[0], args, dev, use_bf16)
        s = result["smollm2"]["fwd_bwd_tokens_per_s"]
        # learner seconds of one RL step (proximal pass skipped, as in the default one-epoch one-mini-batch config)
        est = {k: round(args.step_tokens / v, 1) for k, v in s.items()}
        result["smollm2_step_learner_s_est"] = est
        print(f"[smollm2] learner seconds for a {args.step_tokens}-token RL step (estimate): {est}", flush=True)
        for ratio in ("aligned_over_plain_fp32", "bf16_over_fp32_plain", "bf16_over_fp32_aligned",
                      "bf16bwd_over_fp32_plain", "bf16bwd_over_fp32_aligned"):
            for k in (ratio, ratio + "_best"):
                if k in result["smollm2"]:
                    result[f"smollm2_{k}"] = result["smollm2"][k]
    if not args.skip_tiny:
        torch.manual_seed(0)
        result["tiny"] = bench_model("tiny", tiny_policy(), args, dev, use_bf16)
    machine["load_avg_end"] = load_avg()
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
