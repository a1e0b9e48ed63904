"""From a config to a trained run: policy (tiny or a checkpoint), warm start, RL (``interq train``/``sft``)."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import torch

from interq.train.config import ConfigError, RunConfig, save_config


def _quiet_transformers() -> None:
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()
    except Exception:  # pragma: no cover
        pass


def prepare_policy(cfg: RunConfig, out_dir: str | Path, *, fresh: bool = False, log=print) -> tuple[Path, dict]:
    """Build (tiny) or load the policy, warm-start it on expert demos, save it to ``out_dir`` (atomically).

    Returns the policy directory and a summary. An existing warm start in ``out_dir`` is reused only when it was
    made from the same inputs by the same numerics (:mod:`interq.train.provenance`); otherwise
    :class:`~interq.train.provenance.StaleResultError` before any work, or with ``fresh`` it is moved aside and
    made again.
    """
    from interq import rundir

    if cfg.model.source != "tiny":  # the checkpoint to fine-tune, checked before any work
        from interq.train.policy import check_policy_dir

        check_policy_dir(cfg.model.source, "model.source")
    with rundir.scope("sft", [out_dir]):
        return _prepare_policy(cfg, Path(out_dir), fresh, log)


def _prepare_policy(cfg: RunConfig, out_dir: Path, fresh: bool, log) -> tuple[Path, dict]:
    import tempfile

    from interq.train.build import (agent_render, chat_format, collect_demos, demo_answer, demo_rows, demo_texts,
                                    env_factory, split_tasks)
    from interq.train.config import NonFiniteTrainingError
    from interq.train.policy import build_tiny_policy, describe_policy, load_policy, nonfinite_parameters, save_policy
    from interq.train.provenance import settle, warm_start_differences, write_warm_start_provenance
    from interq.train.sft import resolve_tokens_per_microbatch, run_sft

    settle([(out_dir, warm_start_differences(cfg, out_dir))], fresh, log)
    if (out_dir / "policy_summary.json").is_file():
        return out_dir, json.loads((out_dir / "policy_summary.json").read_text())
    _quiet_transformers()
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    t0 = time.perf_counter()
    make_env = env_factory(cfg.env)
    env_info: dict = {}
    train_tasks, _ = split_tasks(make_env, cfg.env, env_info)
    w = cfg.warm_start
    by_index = cfg.env.action_format == "index"
    render, answer = agent_render(cfg), demo_answer(cfg)  # env.prompt: compact, or verl-agent's with <action> tags
    n_demos = max(w.num_demos, 32) if cfg.model.source == "tiny" else w.num_demos
    demos = collect_demos(make_env, train_tasks, n_demos, w.noise if w.enabled else 0.0, w.seed, cfg.env.max_turns,
                          cfg.algo.layout, cfg.rollout.history_turns, render, by_index, answer)
    if cfg.model.source == "tiny":
        # the tokenizer is trained on expert text without noise so every admissible action is in its corpus
        clean = collect_demos(make_env, train_tasks, min(len(train_tasks), 64), 0.0, w.seed + 1, cfg.env.max_turns,
                              cfg.algo.layout, cfg.rollout.history_turns, render, by_index, answer)
        model, tokenizer = build_tiny_policy(cfg.model, demo_texts(demos + clean), seed=cfg.train.seed)
    else:
        model, tokenizer = load_policy(cfg.model.source, cfg.model.dtype)
    summary = {"policy": describe_policy(model, tokenizer), "demos": len(demos),
               "demo_success": sum(d.won for d in demos) / max(len(demos), 1),
               "demos_stopped": sum(bool(d.stopped) for d in demos)}  # cut short: the expert had no usable action
    if env_info:
        summary["env"] = env_info  # what the environment chose (e.g. ALFWorld's game source)
    if w.enabled and w.steps > 0:
        fmt = chat_format(tokenizer)
        rows = demo_rows(demos[: w.num_demos], fmt, tokenizer, cfg.algo.layout)
        per_step = min(w.episodes_per_microbatch, len(rows))
        row_tokens = sum(len(ids) for ids, _ in rows) / max(len(rows), 1)
        log(f"[warm start] {w.steps} steps of {per_step} of {len(rows)} demonstration rows, about "
            f"{per_step * row_tokens:,.0f} tokens a step ({summary['policy']['parameters']:,} "
            "parameters): the first progress line comes after the first step")
        last = [0.0]

        def progress(step: int, m: dict) -> None:
            if step % max(1, w.steps // 5) == 0 or step == w.steps - 1:
                log(f"[warm start] step {step + 1}/{w.steps} loss {m['loss']:.3f} ({time.perf_counter() - t0:.0f}s)")
            last[0] = m["loss"]

        pretrained = cfg.model.source != "tiny"
        summary.update(run_sft(model, rows, w, fmt.pad_token_id, progress,
                               tokens_per_microbatch=resolve_tokens_per_microbatch(w, pretrained),
                               checkpoint_layers=pretrained))
        bad = nonfinite_parameters(model)
        if bad:  # a finite last loss can still leave weights that are not: never saved, never trained on
            raise NonFiniteTrainingError(f"the warm start diverged: after {w.steps} steps {len(bad)} weight tensors "
                                         f"hold NaN or infinite values ({', '.join(bad[:3])}; warm_start.lr={w.lr:g}); "
                                         f"nothing was saved to {out_dir}. Lower warm_start.lr")
    summary["seconds"] = time.perf_counter() - t0
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}.{os.getpid()}."))
    try:
        save_policy(model, tokenizer, tmp)
        save_config(cfg, tmp / "run_config.yaml")
        write_warm_start_provenance(cfg, tmp)
        (tmp / "policy_summary.json").write_text(json.dumps(summary, indent=1))
        if out_dir.exists():
            out_dir.rmdir()  # only an empty directory is left here (settle refused or moved anything else)
        os.replace(tmp, out_dir)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, Exception) and not isinstance(e, ConfigError):  # a full disk, an I/O error: one line
            from interq.train.checkpoint import save_failure

            raise save_failure(e, "the warm start", out_dir.parent) from None
        raise
    prune_abandoned_saves(out_dir)
    return out_dir, summary


def prune_abandoned_saves(out_dir: Path) -> list[Path]:
    """Remove what warm-start saves into ``out_dir`` killed mid-write left beside it (``.NAME.PID.xxxx``, written
    by a process that no longer runs); a save still in progress in another live process is left alone."""
    removed = []
    for p in out_dir.parent.glob(f".{out_dir.name}.*.*"):
        pid = p.name[len(out_dir.name) + 2:].split(".", 1)[0]
        if p.is_dir() and pid.isdigit() and not _pid_alive(int(pid)):
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
    return removed


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return False  # ours: this save is finished
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def run_training(cfg: RunConfig, run_dir: str | Path, policy_dir: str | Path | None = None, *, resume: bool = True,
                 fresh: bool = False, log=print, force: bool = False) -> list[dict]:
    """Warm start (unless ``policy_dir`` is given) then RL; everything under ``run_dir`` (see :func:`_run_training`).

    Before any work: ``run_dir`` is checked (a file, not writable, holding files a run does not write: refused,
    the last unless ``force``) and locked for this process (:mod:`interq.rundir`), and the starting policy
    directory (``policy_dir``, or a ``model.source`` directory) is checked file by file
    (:func:`interq.train.policy.check_policy_dir`). Peak memory is said at the end."""
    from interq import rundir
    from interq.train.policy import check_policy_dir

    if policy_dir is not None:
        check_policy_dir(policy_dir, "--policy")
    elif cfg.model.source != "tiny":
        check_policy_dir(cfg.model.source, "model.source")
    with rundir.scope("train", [run_dir], force=force):
        recs = _run_training(cfg, run_dir, policy_dir, resume=resume, fresh=fresh, log=log)
        log(f"[run] {Path(run_dir)}: {rundir.peak_memory_line()}")
        return recs


def _run_training(cfg: RunConfig, run_dir: str | Path, policy_dir: str | Path | None = None, *, resume: bool = True,
                  fresh: bool = False, log=print) -> list[dict]:
    """Warm start (unless ``policy_dir`` is given) then RL; everything under ``run_dir``.

    Before any work, the warm start ``run_dir/warm_start`` and the run in ``run_dir`` are checked against ``cfg``
    (:mod:`interq.train.provenance`): reused / resumed when they match, else
    :class:`~interq.train.provenance.StaleResultError`, or with ``fresh`` each differing one is moved aside to
    ``<dir>.stale-<time>`` (a matching warm start stays in place) and started again.
    """
    from interq.train.build import env_factory, split_tasks
    from interq.train.policy import load_policy
    from interq.train.provenance import (policy_identity, run_differences, settle, warm_start_differences,
                                         warm_start_identity)
    from interq.train.rl import train

    run_dir = Path(run_dir)
    checks = []
    if policy_dir is None:
        checks.append((run_dir / "warm_start", warm_start_differences(cfg, run_dir / "warm_start")))
        start_policy = warm_start_identity(cfg)
    else:
        start_policy = policy_identity(policy_dir)
        checks.append((Path(policy_dir), []))  # a policy kept inside run_dir stays there with --fresh
    checks.append((run_dir, run_differences(cfg, run_dir, start_policy)))
    settle(checks, fresh, log)
    _quiet_transformers()
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    if policy_dir is None:
        policy_dir, summary = prepare_policy(cfg, run_dir / "warm_start", log=log)
        log(f"[warm start] policy {summary['policy']} in {summary.get('seconds', 0):.0f}s"
            + (f" (peak memory {summary['sft/peak_rss_mib']:.0f} MiB)" if "sft/peak_rss_mib" in summary else ""))
    model, tokenizer = load_policy(policy_dir, cfg.model.dtype)
    make_env = env_factory(cfg.env)
    env_info: dict = {}
    train_tasks, eval_tasks = split_tasks(make_env, cfg.env, env_info)
    if env_info:  # what the environment plays (engine, version, data source, splits, task types), kept with the run
        from interq.train.atomic import write_text_atomic

        run_dir.mkdir(parents=True, exist_ok=True)
        write_text_atomic(run_dir / "env_info.json", json.dumps(env_info, indent=1) + "\n")
    return train(cfg, run_dir, model, tokenizer, make_env, train_tasks, eval_tasks, resume=resume,
                 start_policy=start_policy)
