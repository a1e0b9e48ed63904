"""Fault test (issue 13): ``interq train`` killed with SIGKILL at seeded random points and resumed each time ends
with the same metrics as an uninterrupted run, every step recorded exactly once."""

import json
import os
import random
import signal
import subprocess
import sys
import time

# a quiet machine logs about 3 steps between a new line and the kill: 24 steps leave room for 6 kills
STEPS = 24
TOY = ["env.name=toy", "env.max_turns=3", "env.num_train_tasks=8", "env.num_eval_tasks=2", "env.env_kwargs={length: 2}",
       "model.vocab_size=300", "model.hidden_size=16", "model.intermediate_size=32", "model.num_heads=2",
       "model.num_kv_heads=1", "model.head_dim=8", "warm_start.num_demos=8", "warm_start.steps=3",
       "train.tasks_per_step=2", "train.episodes_per_task=2", "train.progress=false", "rollout.max_action_tokens=3",
       f"train.steps={STEPS}", "train.eval_every_steps=5", "train.checkpoint_every_steps=1", "train.threads=1"]
KILLS = 6
SEED = 13


def _cmd(out):
    return [sys.executable, "-m", "interq", "train", "--preset", "q-interq", "--out", str(out), *TOY]


def _env():
    return {**os.environ, "OMP_NUM_THREADS": "1"}


def _lines(path):
    try:
        return len([ln for ln in path.read_text().splitlines() if ln.strip()])
    except FileNotFoundError:
        return 0


def _records(path):
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]


def _deterministic(recs):
    return [{k: v for k, v in r.items() if not k.startswith("time/") and k != "sync/seconds"} for r in recs]


def test_sigkill_at_random_points_then_resume_matches_an_uninterrupted_run(tmp_path):
    full_dir, killed_dir = tmp_path / "full", tmp_path / "killed"
    subprocess.run(_cmd(full_dir), env=_env(), check=True, capture_output=True, timeout=600)
    full = _records(full_dir / "metrics.jsonl")
    assert [r["step"] for r in full] == list(range(STEPS + 1))

    rng = random.Random(SEED)
    metrics = killed_dir / "metrics.jsonl"
    kills, log = 0, []
    while kills < KILLS:
        # each attempt runs until it has logged a step beyond every earlier attempt, then dies a seeded random time
        # later: in the checkpoint write that follows the log line, the next rollout, update or eval
        before = _lines(metrics)
        proc = subprocess.Popen(_cmd(killed_dir), env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 300
        while _lines(metrics) <= before and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(rng.uniform(0.0, 0.3))
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            kills += 1
        _, err = proc.communicate(timeout=120)
        log.append((before, _lines(metrics), proc.returncode))
        assert proc.returncode in (0, -signal.SIGKILL), err.decode()[-2000:]
        if proc.returncode == 0:
            break
    assert kills >= 5, f"the run finished before {KILLS} kills landed: {log}"
    # the last resume completes
    done = subprocess.run(_cmd(killed_dir), env=_env(), capture_output=True, timeout=600)
    assert done.returncode == 0, done.stderr.decode()[-2000:]

    recs = _records(metrics)
    assert [r["step"] for r in recs] == list(range(STEPS + 1)), f"steps lost or duplicated; attempts {log}"
    got, want = _deterministic(recs), _deterministic(full)
    for g, w in zip(got, want):
        assert g == w, f"step {w['step']} differs from the uninterrupted run (attempts {log})"
    assert any("loss/policy" in r and "rollout/success" in r for r in got)
