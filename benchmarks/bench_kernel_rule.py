"""Which of interq's hand-written CPU speed pieces the steps a user waits for actually feel: each piece turned off
(routed to its torch reference or fallback, the same numbers or within rounding) against everything on.

Workloads (process CPU seconds of the measured part only, one torch thread; each measurement a fresh process, so
that the switches read at import time apply):

- ``study``: one step of the comparison study (``--setting study-1k --regimes matched``: the tiny household policy
  from the shipped warm start ``interq/policies/household_text``, 8 tasks x 8 episodes, a W4A4-KV4 executor, the
  q-interq arm): its rollout of 64 episodes (``study_rollout``, played ``--study-reps`` times) and its learner update
  (``study_learner``, ``--study-reps`` updates from the same weights), as ``benchmarks/bench_study_step.py`` builds them;
- ``smol_rollout``: the quantized arm's multi-turn rollout on SmolLM2-135M (q-interq: W8A8-KV8 executor,
  ``model.source=smollm2 env.action_format=text``, the concatenated layout of ``scripts/rlstep.sh``):
  ``--smol-tasks`` x ``--smol-episodes`` household episodes of step 1 (``--smol-arm bf16``: the bf16 arm's rollout
  instead, every linear in bf16);
- ``smol_learner``: one q-interq learner update (aligned forward, concatenated layout) of SmolLM2 on the first
  ``--learner-episodes`` episodes of that rollout (the batch is made once, by the census, and loaded by each run).

Pieces (``PIECES``): an existing switch (``INTERQ_CPU_KERNELS=0``, ``INTERQ_FAST_LAYERS=0``,
``INTERQ_FLASH_DECODE=0``, a config field), or a monkeypatch in the measuring process that sends that one piece to
the fallback interq itself takes where the piece does not apply. Nothing in ``src/`` changes. A census run first
counts, per workload, the calls of every compiled kernel function (all pieces on); a piece whose functions a
workload never calls is not timed there (``not called``).

Per round, per workload: ``on, off(p1), on, off(p2), ..., on``; a piece's ratio in a round is its CPU seconds over the
mean of the two ``on`` runs beside it; the result is the median over ``--rounds`` rounds. Process CPU seconds are
user + system time (``ratios``); ``ratios_user`` counts user time alone: on a machine short of memory the kernel's
page reclaim is charged to whichever process allocates, as system time that says nothing about the piece. Pieces marked ``opt_in``
are off by default on this machine: their run turns them on, and the ratio is still default/piece (off/on).
The last line is ``RESULT {json}``: ``ratios[piece][workload]`` = off/on, the seconds, the census and the machine
(``interq.machine.machine_info()`` at the start, ``load_avg_end`` at the end).

    nice -n 5 .venv/bin/python benchmarks/bench_kernel_rule.py [--rounds 2] [--pieces a,b] [--workloads study,...]

A lower CPU class's pieces (the avx2 int8 backend, the learner attention's AVX2 branch; the vnni int8 backend of an
AVX-512 VNNI CPU without native bf16) run on a higher CPU with the kernels built for it and torch, MKL and oneDNN
capped to it; the caps are recorded in the result (``isa_caps``):

    INTERQ_KERNELS_MARCH=x86-64-v3 ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2 \
        .venv/bin/python benchmarks/bench_kernel_rule.py --pieces all_kernels,int8_avx2 --workloads study
    INTERQ_KERNELS_MARCH=cascadelake ATEN_CPU_CAPABILITY=avx512 MKL_ENABLE_INSTRUCTIONS=AVX512_E1 \
        ONEDNN_MAX_CPU_ISA=AVX512_CORE_VNNI .venv/bin/python benchmarks/bench_kernel_rule.py \
        --pieces all_kernels,int8_vnni
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

RULE = 1.15  # a piece stays where turning it off makes a waited-for step at least this much slower
WORKLOADS = ("study", "smol_rollout", "smol_learner")
PARTS = {"study": ("study_rollout", "study_learner"), "smol_rollout": ("smol_rollout",),
         "smol_learner": ("smol_learner",)}
SMOL_BASE = ["model.source=smollm2", "env.action_format=text", "warm_start.enabled=false", "algo.layout=concatenated",
             "train.threads=1", "train.progress=false"]


@dataclass
class Piece:
    what: str
    kernels: tuple[str, ...]  # compiled functions it stands for (the census decides where it is timed); () = always
    env: dict = field(default_factory=dict)  # switches read at import time
    overrides: tuple[str, ...] = ()  # config overrides of the measured run
    opt_in: bool = False  # off by default here: the measured run turns it on
    parts: tuple[str, ...] = ()  # restrict to these parts (else every part whose census shows its kernels)
    together: tuple[str, ...] = ()  # other pieces turned off at once (their switches and patches)


PIECES: dict[str, Piece] = {
    "all_kernels": Piece("every compiled kernel (INTERQ_CPU_KERNELS=0: torch's ops, the same numbers)", (),
                         env={"INTERQ_CPU_KERNELS": "0"}),
    "lean_layers": Piece("the rollout's lean decoder-layer forward (INTERQ_FAST_LAYERS=0)", (),
                         env={"INTERQ_FAST_LAYERS": "0"}, parts=("study_rollout", "smol_rollout")),
    "flash_decode": Piece("flash_decode_amx, the one-call decode attention (INTERQ_FLASH_DECODE=0: torch's sdpa)",
                          ("flash_decode_amx",), env={"INTERQ_FLASH_DECODE": "0"}),
    "int8_amx": Piece("the amx int8 backend: int8_linear_amx / int8_gemm_amx (int8 backend auto -> int_mm: "
                      "torch._int_mm; the activation-quant and epilogue kernels stay)",
                      ("int8_linear_amx", "int8_gemm_amx")),
    "int8_vnni": Piece("the vnni int8 backend: int8_gemm_vnni for decode-sized GEMMs (int8 backend auto -> int_mm: "
                       "torch._int_mm, which the vnni backend calls above VNNI_MAX_M rows anyway)",
                       ("int8_gemm_vnni",)),
    "int8_avx2": Piece("the avx2 int8 backend: int8_gemm_avx2 / int8_linear_avx2 (int8 backend auto -> fp32_exact, "
                       "what auto takes without it)", ("int8_gemm_avx2", "int8_linear_avx2")),
    "int8_whole_linear": Piece("int8_linear_amx's one call (whole_linear_kernel -> None: quant_act_int8, "
                               "int8_gemm_amx and epilogue called in turn)",
                               ("int8_linear_amx",)),
    "quant_act_epilogue": Piece("quant_act_int8 and epilogue (the eager activation quantizer and epilogue)",
                                ("quant_act_int8", "epilogue")),
    "rms_norm": Piece("rms_norm_bf16 / torch_row_sums (no FusedRMSNorm: transformers' RMSNorm)",
                      ("rms_norm_bf16",)),
    "bf16_linear_amx": Piece("bf16_linear_amx, the AMX-BF16 product of the executor's bf16 linears (lm_head here; "
                             "use_amx_product(False): F.linear)", ("bf16_linear_amx",)),
    "bf16_linear_avx2": Piece("bf16_linear_avx2, interq's AVX2 bf16 product of the executor's bf16 linears, on CPUs "
                              "without native bf16 (use_avx2_product(False): F.linear, torch's own bf16 kernel there)",
                              ("bf16_linear_avx2",)),
    "sdpa_packed": Piece("the rollout's packed-GQA attention sdpa_packed, flash decode included (rollout.attention=sdpa: "
                         "transformers' sdpa, to rounding)", (), overrides=("rollout.attention=sdpa",),
                         parts=("study_rollout", "smol_rollout")),
    "bf16_backward": Piece("the learner's bf16 backward GEMMs (train.learner_autocast=off: fp32, to rounding)", (),
                           overrides=("train.learner_autocast=off",), parts=("study_learner", "smol_learner")),
    "learner_attention_kernel": Piece("causal_attention_fwd/bwd (opt-in on Intel: train.learner_attention=kernel "
                                      "against the default sdpa)", (), overrides=("train.learner_attention=kernel",),
                                      opt_in=True, parts=("study_learner", "smol_learner")),
    "learner_onednn": Piece("the learner's fp32 GEMMs through oneDNN (opt-in: train.learner_gemm=onednn against "
                            "torch's, to rounding)", (), overrides=("train.learner_gemm=onednn",), opt_in=True,
                            parts=("study_learner", "smol_learner")),
}
# every rollout piece below the rule on its own, off at once (the amx int8 GEMM and sdpa_packed stay)
PIECES["below_rule_together"] = Piece(
    "lean_layers, flash_decode, int8_whole_linear, rms_norm and bf16_linear_amx off at once", (),
    together=("lean_layers", "flash_decode", "int8_whole_linear", "rms_norm", "bf16_linear_amx"),
    parts=("study_rollout", "smol_rollout"))


# ----------------------------------------------------------------------------------- the measured process


class CpuTimer:
    """This process's user and system CPU seconds over the ``with`` blocks it times (added up)."""

    def __init__(self):
        self.user = self.system = 0.0

    def __enter__(self):
        r = resource.getrusage(resource.RUSAGE_SELF)
        self._start = (r.ru_utime, r.ru_stime)
        return self

    def __exit__(self, *exc):
        r = resource.getrusage(resource.RUSAGE_SELF)
        self.user += r.ru_utime - self._start[0]
        self.system += r.ru_stime - self._start[1]


def timings(**timers: CpuTimer) -> dict:
    """-> {"cpu_s": user + system per part, "user_s": user per part, "sys_s": system per part}."""
    return {"cpu_s": {k: t.user + t.system for k, t in timers.items()}, "user_s": {k: t.user for k, t in timers.items()},
            "sys_s": {k: t.system for k, t in timers.items()}}


# what makes this machine run a lower CPU class's code (docs/executor.md, "CPU backends"): recorded with the result
ISA_CAPS = ("INTERQ_KERNELS_MARCH", "ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA")


def isa_caps() -> dict:
    return {k: os.environ[k] for k in ISA_CAPS if os.environ.get(k)}


# the int8 backend pieces and what ``auto`` resolves to with each one off
INT8_INSTEAD = {"int8_amx": "int_mm", "int8_vnni": "int_mm", "int8_avx2": "fp32_exact"}


def patch_off(piece: str) -> None:
    """Route ``piece`` to interq's own fallback for this process (the pieces with an environment switch or a config
    override need nothing here)."""
    from importlib import import_module

    # the modules themselves (interq.quant re-exports functions under some module names)
    kernels, L, P, R, PL = (import_module(f"interq.{m}") for m in (
        "kernels", "quant.linear", "quant.primitives", "kernels.rms_norm", "kernels.packed_linear"))

    if piece in INT8_INSTEAD:  # an int8 backend off: auto takes the backend it would without it
        resolve, instead = L.resolve_int8_backend, INT8_INSTEAD[piece]
        L.resolve_int8_backend = lambda b, device=None: resolve(instead if b == "auto" else b, device)
    elif piece == "int8_whole_linear":
        L.whole_linear_kernel = lambda *a, **k: None
    elif piece == "quant_act_epilogue":
        L.quant_act_int8 = lambda x2, rounding, a_bits: P.quant_act_int8_token(x2, rounding, a_bits)
        split = L.epilogue_split

        def eager_split(acc, s_a, s_w, bias, sizes, out_dtype):
            was = kernels._ENABLED["value"]
            kernels._ENABLED["value"] = False  # kernels.get() -> None inside: epilogue_split's eager branch
            try:
                return split(acc, s_a, s_w, bias, sizes, out_dtype)
            finally:
                kernels._ENABLED["value"] = was

        L.epilogue_split = eager_split
    elif piece == "rms_norm":
        R.FusedRMSNorm.from_norm = classmethod(lambda cls, norm: None)
    elif piece == "bf16_linear_amx":
        PL.use_amx_product(False)
    elif piece == "bf16_linear_avx2":
        PL.use_avx2_product(False)


class _Counting:
    """The kernels module with every function call counted (the census)."""

    def __init__(self, mod, counts: dict):
        self._mod, self._counts, self._wrapped = mod, counts, {}

    def __getattr__(self, name):
        fn = getattr(self._mod, name)
        if not callable(fn) or name.startswith("has_"):
            return fn
        if name not in self._wrapped:
            def call(*a, _fn=fn, _name=name, **k):
                self._counts[_name] = self._counts.get(_name, 0) + 1
                return _fn(*a, **k)

            self._wrapped[name] = call
        return self._wrapped[name]


def start_census() -> dict:
    from interq import kernels

    counts: dict = {}
    mod = kernels.load()
    if mod is not None:
        kernels._STATE["module"] = _Counting(mod, counts)
    return counts


def study_parts(args, overrides: list[str], counts: dict | None) -> dict:
    """CPU seconds of one study step's rollout and learner update (each ``--study-reps`` times)."""
    import copy
    from importlib import resources

    import torch
    from bench_study_step import rollout_setup  # a sibling script: benchmarks/ is on sys.path when run as one

    from interq.train import rl
    from interq.train.experiments import REGIMES, SETTINGS, arm_config

    cfg = arm_config("q-interq", [*SETTINGS["study-1k"], *REGIMES["matched"], "train.progress=false", *overrides])
    run = rollout_setup(cfg, str(resources.files("interq") / "policies" / "household_text"))
    model, fmt, make_env, train_tasks = run.model, run.fmt, run.make_env, run.train_tasks
    executor, engine = run.executor, run.engine
    tasks, seeds, groups = rl.step_tasks(train_tasks, cfg, 1)
    census, rollout_t, learner_t = {}, CpuTimer(), CpuTimer()
    with rollout_t:
        for _ in range(args.study_reps):
            episodes = rl.rollout(engine, fmt, make_env, tasks, seeds, groups, rl.sampling_params(cfg, fmt), cfg)
    if counts is not None:
        census["study_rollout"] = dict(counts)
        counts.clear()
    batch = rl.build_batch(episodes, cfg.algo, fmt.pad_token_id)
    state = copy.deepcopy(model.state_dict())
    learner = rl.Learner(model, cfg, executor.qcfg)
    for _ in range(args.study_reps):
        model.load_state_dict(state)
        learner.optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.optim.lr)
        with learner_t:
            rl.update(learner, batch, cfg, 1)
    if counts is not None:
        census["study_learner"] = dict(counts)
    return {**timings(study_rollout=rollout_t, study_learner=learner_t), "census": census, "tokens": int(batch.attention_mask.sum()), "rows": len(batch.input_ids)}


def smol_config(args, overrides: list[str]):
    from interq.train.experiments import arm_config

    return arm_config(args.smol_arm, [*SMOL_BASE, f"train.tasks_per_step={args.smol_tasks}",
                                   f"train.episodes_per_task={args.smol_episodes}", *overrides])


def smol_rollout(args, overrides: list[str], counts: dict | None) -> dict:
    """CPU seconds of the SmolLM2 rollout of step 1 (``--smol-arm``'s executor); the census also saves the learner's
    batch."""
    import torch
    from bench_study_step import rollout_setup  # a sibling script: benchmarks/ is on sys.path when run as one

    from interq.train import rl

    cfg = smol_config(args, overrides)
    run = rollout_setup(cfg, cfg.model.source)
    fmt, make_env, train_tasks, engine = run.fmt, run.make_env, run.train_tasks, run.engine
    tasks, seeds, groups = rl.step_tasks(train_tasks, cfg, 1)
    with CpuTimer() as t:
        episodes = rl.rollout(engine, fmt, make_env, tasks, seeds, groups, rl.sampling_params(cfg, fmt), cfg)
    res = {**timings(smol_rollout=t), "census": {"smol_rollout": dict(counts)} if counts is not None else {},
           "episodes": len(episodes), "turns": sum(ep.num_turns for ep in episodes)}
    if counts is not None:
        batch = rl.build_batch(episodes[: args.learner_episodes], cfg.algo, fmt.pad_token_id)
        torch.save(batch, args.batch)
        res["learner_tokens"] = int(batch.attention_mask.sum())
    return res


def smol_learner(args, overrides: list[str], counts: dict | None) -> dict:
    """CPU seconds of one SmolLM2 q-interq learner update of the saved batch."""
    import torch

    from interq.train import rl
    from interq.train.build import quant_config
    from interq.train.policy import load_policy

    cfg = smol_config(args, overrides)
    model, _ = load_policy(cfg.model.source, cfg.model.dtype)
    batch = torch.load(args.batch, weights_only=False)
    learner = rl.Learner(model, cfg, quant_config(cfg.rollout))
    with CpuTimer() as t:
        rl.update(learner, batch, cfg, 1)
    return {**timings(smol_learner=t), "census": {"smol_learner": dict(counts)} if counts is not None else {},
            "tokens": int(batch.attention_mask.sum())}


def worker(args) -> None:
    import torch

    torch.set_num_threads(1)
    piece = PIECES.get(args.off)
    if piece is not None:
        for name in (args.off, *piece.together):
            patch_off(name)
    counts = start_census() if args.census else None
    overrides = list(piece.overrides) if piece is not None else []
    run = {"study": study_parts, "smol_rollout": smol_rollout, "smol_learner": smol_learner}[args.worker]
    print("WORKER " + json.dumps(run(args, overrides, counts)), flush=True)


# ----------------------------------------------------------------------------------- the parent


def measure(args, workload: str, off: str | None, census: bool = False) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("INTERQ_CPU_KERNELS", "INTERQ_FAST_LAYERS",
                                                           "INTERQ_FLASH_DECODE")}
    env["OMP_NUM_THREADS"] = "1"
    if off is not None:
        for name in (off, *PIECES[off].together):
            env.update(PIECES[name].env)
    cmd = [sys.executable, __file__, "--worker", workload, "--off", off or "none", "--batch", args.batch,
           "--study-reps", str(args.study_reps), "--smol-tasks", str(args.smol_tasks),
           "--smol-episodes", str(args.smol_episodes), "--smol-arm", args.smol_arm,
           "--learner-episodes", str(args.learner_episodes)]
    if census:
        cmd.append("--census")
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("WORKER ")]
    if p.returncode != 0 or not lines:
        raise RuntimeError(f"{workload} with {off or 'all on'} off failed (exit {p.returncode}):\n{p.stderr[-3000:]}")
    return json.loads(lines[-1][len("WORKER "):])


def timed_pieces(workload: str, census: dict, chosen: list[str]) -> dict[str, list[str]]:
    """piece -> the parts of ``workload`` where it is timed (its kernels called there, or its part named)."""
    out = {}
    for name in chosen:
        p = PIECES[name]
        parts = [part for part in PARTS[workload]
                 if (not p.parts or part in p.parts)
                 and (not p.kernels or any(census.get(part, {}).get(k, 0) for k in p.kernels))]
        if parts:
            out[name] = parts
    return out


def _learner_attention_default_here() -> None:
    """Where ``train.learner_attention=auto`` takes the kernel (off Intel), it is no opt-in: its measured run turns
    it off (``sdpa``) against the default, as for every other piece; elsewhere it stays the opt-in above."""
    from interq.train.config import resolve_learner_attention

    if resolve_learner_attention("auto") == "kernel":
        PIECES["learner_attention_kernel"] = Piece(
            "causal_attention_fwd/bwd (train.learner_attention=auto takes them on this CPU; off: sdpa)", (),
            overrides=("train.learner_attention=sdpa",), parts=("study_learner", "smol_learner"))


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--pieces", default=",".join(PIECES), help="comma-separated names of PIECES")
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument("--study-reps", type=int, default=2)
    p.add_argument("--smol-tasks", type=int, default=1)
    p.add_argument("--smol-episodes", type=int, default=4)
    p.add_argument("--smol-arm", choices=("q-interq", "bf16"), default="q-interq",
                   help="the SmolLM2 workloads' arm: q-interq (W8A8-KV8 executor) or bf16")
    p.add_argument("--learner-episodes", type=int, default=1)
    p.add_argument("--batch", default="runs/bench_kernel_rule/smol_batch.pt", help="the SmolLM2 learner's batch")
    p.add_argument("--worker", choices=WORKLOADS, help=argparse.SUPPRESS)
    p.add_argument("--off", default="none", help=argparse.SUPPRESS)
    p.add_argument("--census", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    _learner_attention_default_here()
    if args.worker:
        worker(args)
        return {}
    chosen = [x for x in args.pieces.split(",") if x]
    workloads = [x for x in args.workloads.split(",") if x]
    for name in chosen:
        if name not in PIECES:
            raise SystemExit(f"--pieces: {name!r} is not one of {', '.join(PIECES)}")
    for name in workloads:
        if name not in WORKLOADS:
            raise SystemExit(f"--workloads: {name!r} is not one of {', '.join(WORKLOADS)}")
    import torch

    from interq.machine import describe, load_avg, machine_info

    torch.set_num_threads(1)
    info = machine_info()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    print(describe(info), flush=True)
    print(f"commit {commit}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, nice {os.nice(0)}", flush=True)
    Path(args.batch).parent.mkdir(parents=True, exist_ok=True)
    census, sizes = {}, {}
    for wl in workloads:  # the census: every kernel function each part calls, all on (also makes the smol batch)
        r = measure(args, wl, None, census=True)
        census.update(r["census"])
        sizes[wl] = {k: v for k, v in r.items() if k not in ("census", "cpu_s", "user_s", "sys_s")}
        print(f"census {wl}: {json.dumps(r['census'])} {json.dumps(sizes[wl])}", flush=True)
    plan = {wl: timed_pieces(wl, census, chosen) for wl in workloads}
    for wl in workloads:
        skipped = [n for n in chosen if n not in plan[wl]]
        print(f"{wl}: timed {', '.join(plan[wl]) or 'none'}; not called there: {', '.join(skipped) or 'none'}",
              flush=True)
    seconds: dict = {wl: {"on": [], **{n: [] for n in plan[wl]}} for wl in workloads}
    ratios: dict = {"cpu_s": {}, "user_s": {}}  # clock -> piece -> part -> per-round ratios
    for rnd in range(args.rounds):
        for wl in workloads:
            if not plan[wl]:
                continue
            order = list(plan[wl]) if rnd % 2 == 0 else list(reversed(plan[wl]))
            prev = measure(args, wl, None)
            seconds[wl]["on"].append(prev)
            for name in order:
                off = measure(args, wl, name)
                nxt = measure(args, wl, None)
                seconds[wl][name].append(off)
                seconds[wl]["on"].append(nxt)
                for clock, got in ratios.items():
                    for part in plan[wl][name]:
                        on = (prev[clock][part] + nxt[clock][part]) / 2
                        r = on / off[clock][part] if PIECES[name].opt_in else off[clock][part] / on
                        got.setdefault(name, {}).setdefault(part, []).append(r)
                print(f"round {rnd} {wl} {name}: " + ", ".join(
                    f"{part} off {off['cpu_s'][part]:.2f}s (sys {off['sys_s'][part]:.2f}) on "
                    f"{prev['cpu_s'][part]:.2f}/{nxt['cpu_s'][part]:.2f}s ratio {ratios['cpu_s'][name][part][-1]:.3f} "
                    f"(user only {ratios['user_s'][name][part][-1]:.3f})" for part in plan[wl][name])
                    + f" (load {load_avg()})", flush=True)
                prev = nxt
    med = {clock: {n: {part: round(statistics.median(v), 3) for part, v in d.items()} for n, d in got.items()}
           for clock, got in ratios.items()}
    parts = [part for wl in workloads for part in PARTS[wl]]
    for clock, title in (("cpu_s", "process CPU s (user + system)"), ("user_s", "user CPU s only")):
        print(f"\npiece x part: off/on of {title}, median of rounds; * = at least the rule's {RULE}x")
        print(f"{'piece':26s}" + "".join(f"{part:>15s}" for part in parts))
        for n in chosen:
            row = [f"{med[clock][n][part]:.3f}{'*' if med[clock][n][part] >= RULE else ' '}"
                   if part in med[clock].get(n, {}) else "not called" for part in parts]
            print(f"{n:26s}" + "".join(f"{c:>15s}" for c in row))
    on_s = {clock: {part: round(statistics.median(r[clock][part] for r in seconds[wl]["on"]), 2)
                    for wl in workloads for part in PARTS[wl] if seconds[wl]["on"]} for clock in ("cpu_s", "user_s")}
    per_round = {clock: {n: {part: [round(x, 3) for x in v] for part, v in d.items()} for n, d in got.items()}
                 for clock, got in ratios.items()}
    res = {"rule": RULE, "ratios": med["cpu_s"], "ratios_user": med["user_s"],
           "passes": {n: [part for part, v in d.items() if v >= RULE] for n, d in med["cpu_s"].items()},
           "ratios_per_round": per_round, "on_median": on_s, "census": census, "sizes": sizes,
           "pieces": {n: PIECES[n].what for n in chosen}, "commit": commit,
           "settings": {k: getattr(args, k) for k in ("rounds", "study_reps", "smol_tasks", "smol_episodes",
                                                       "smol_arm", "learner_episodes")},
           "machine": {**info, "load_avg_end": load_avg(), "isa_caps": isa_caps()}}
    print("RESULT " + json.dumps(res))
    return res


if __name__ == "__main__":
    main()
