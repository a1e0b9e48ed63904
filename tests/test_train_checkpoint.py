"""Crash-safe checkpoints and resume: weights, optimizer, RNG, step; a half-written, incomplete or corrupted
checkpoint is never loaded (refused, or skipped for the previous complete one), a crash at any point of a save
leaves a complete checkpoint, everything loads with weights_only=True, and a torn metrics line loses no step."""

import json
import os
import random
import shutil

import numpy as np
import pytest
import torch

from interq.train.checkpoint import (CheckpointError, check_checkpoint, discard_checkpoints, latest_checkpoint,
                                     load_checkpoint, resume_checkpoint, save_checkpoint)
from interq.train.logging import RunLogger, read_jsonl
from interq.train.config import ModelConfig, RunConfig
from interq.train.policy import build_tiny_policy

TEXTS = ["go to countertop 1", "take apple 1 from countertop 1", "put apple 1 in/on fridge 1"] * 10


def _policy():
    return build_tiny_policy(ModelConfig(vocab_size=300, hidden_size=16, intermediate_size=32, num_heads=2,
                                         num_kv_heads=1, head_dim=8), TEXTS)


def test_checkpoint_round_trip_and_latest(tmp_path):
    model, tok = _policy()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.tensor([[1, 2, 3]])).logits.sum().backward()
    opt.step()
    torch.manual_seed(123)
    random.seed(5)
    save_checkpoint(tmp_path, 3, model, tok, opt, RunConfig(), {"extra": 1})
    expected_draw = (torch.rand(3), random.random())
    # a crash mid-write leaves a temporary folder: never taken for a checkpoint
    (tmp_path / "checkpoints" / ".tmp_step_000004_x").mkdir()
    ck = latest_checkpoint(tmp_path)
    assert ck.name == "step_000003"

    model2, _ = _policy()
    with torch.no_grad():
        for p in model2.parameters():
            p.add_(1.0)
    opt2 = torch.optim.AdamW(model2.parameters(), lr=1e-2)
    state = load_checkpoint(ck, model2, opt2)
    assert state == {"step": 3, "extra": 1}
    for p, q in zip(model.parameters(), model2.parameters()):
        assert torch.equal(p, q)
    assert opt2.state_dict()["state"][0]["step"] == opt.state_dict()["state"][0]["step"]
    assert torch.equal(torch.rand(3), expected_draw[0]) and random.random() == expected_draw[1]


def test_keeps_only_recent_checkpoints(tmp_path):
    model, tok = _policy()
    for step in (1, 2, 3):
        save_checkpoint(tmp_path, step, model, tok, None, RunConfig(), keep=2)
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("step_*")) == ["step_000002", "step_000003"]
    assert latest_checkpoint(tmp_path).name == "step_000003"


# ---------------------------------------------------------------------------------------------- crash safety


def _trained():
    """A tiny policy and an AdamW that has taken one step (its state is not empty)."""
    model, tok = _policy()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.tensor([[1, 2, 3]])).logits.sum().backward()
    opt.step()
    return model, tok, opt


@pytest.mark.parametrize("name", ["optimizer.pt", "rng.pt", "state.json", "model.safetensors"])
@pytest.mark.parametrize("manifest", [True, False])  # False: a checkpoint as the earlier format wrote it
def test_incomplete_checkpoint_is_refused_with_its_path_and_what_is_missing(tmp_path, name, manifest):
    model, tok, opt = _trained()
    ck = save_checkpoint(tmp_path, 3, model, tok, opt, RunConfig())
    (ck / name).unlink()
    if not manifest:
        (ck / "manifest.json").unlink()
    model2, _, opt2 = _trained()
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(ck, model2, opt2)
    assert str(ck) in str(err.value) and name in str(err.value) and "missing" in str(err.value)


def test_checkpoint_saved_without_optimizer_is_refused_when_one_is_restored(tmp_path):
    model, tok, opt = _trained()
    ck = save_checkpoint(tmp_path, 1, model, tok, None, RunConfig())
    with pytest.raises(CheckpointError, match="optimizer.pt"):
        load_checkpoint(ck, model, opt)
    assert load_checkpoint(ck, model) == {"step": 1}  # weights only: fine


@pytest.mark.parametrize("name, damage, manifest", [
    ("model.safetensors", "truncate", True), ("optimizer.pt", "truncate", True), ("optimizer.pt", "flip", True),
    ("rng.pt", "flip", True), ("state.json", "truncate", True),
    # the earlier format (no manifest): a truncated file fails to load and is refused as corrupted
    ("model.safetensors", "truncate", False), ("optimizer.pt", "truncate", False), ("rng.pt", "truncate", False),
])
def test_corrupted_checkpoint_is_refused(tmp_path, name, damage, manifest):
    model, tok, opt = _trained()
    ck = save_checkpoint(tmp_path, 3, model, tok, opt, RunConfig())
    data = (ck / name).read_bytes()
    if damage == "truncate":
        (ck / name).write_bytes(data[: len(data) // 2])
    else:  # one byte changed, size kept: the manifest's hash tells
        (ck / name).write_bytes(data[:-20] + bytes([data[-20] ^ 0xFF]) + data[-19:])
    if not manifest:
        (ck / "manifest.json").unlink()
    before = [p.detach().clone() for p in model.parameters()]
    model2, _, opt2 = _trained()
    with torch.no_grad():
        for p in model2.parameters():
            p.add_(1.0)
    kept = [p.detach().clone() for p in model2.parameters()]
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(ck, model2, opt2)
    assert str(ck) in str(err.value) and name in str(err.value)
    assert all(torch.equal(p, q) for p, q in zip(model2.parameters(), kept)), "a refused checkpoint changed the model"
    assert not all(torch.equal(p, q) for p, q in zip(before, kept))


def test_loads_only_with_weights_only(tmp_path, monkeypatch):
    model, tok, opt = _trained()
    ck = save_checkpoint(tmp_path, 3, model, tok, opt, RunConfig())
    # what is stored is plain data: torch's safe loader reads it
    torch.load(ck / "optimizer.pt", weights_only=True)
    torch.load(ck / "rng.pt", weights_only=True)
    # a checkpoint of the earlier format (numpy's state pickled as an ndarray) is read safely too
    legacy = tmp_path / "legacy" / "checkpoints" / "step_000003"
    shutil.copytree(ck, legacy)
    (legacy / "manifest.json").unlink()
    np.random.seed(7)
    torch.save({"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()},
               legacy / "rng.pt")
    expected = np.random.rand(3)

    real_load = torch.load
    calls = []

    def safe_only(*args, **kwargs):
        assert kwargs.get("weights_only") is True, "torch.load without weights_only=True"
        calls.append(args[0])
        return real_load(*args, **kwargs)

    monkeypatch.setattr(torch, "load", safe_only)
    model2, _, opt2 = _trained()
    assert load_checkpoint(ck, model2, opt2)["step"] == 3
    np.random.seed(0)
    assert load_checkpoint(legacy, model2, opt2)["step"] == 3
    np.testing.assert_array_equal(np.random.rand(3), expected)
    assert len(calls) == 4  # optimizer.pt and rng.pt of each


def test_rng_state_round_trips(tmp_path):
    from interq.train.checkpoint import rng_state, set_rng_state

    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    np.random.randn()  # numpy keeps a cached gaussian: part of its state
    torch.save(rng_state(), tmp_path / "rng.pt")
    draws = (random.random(), np.random.randn(), np.random.rand(), torch.rand(2))
    random.seed(9)
    np.random.seed(9)
    torch.manual_seed(9)
    set_rng_state(torch.load(tmp_path / "rng.pt", weights_only=True))
    again = (random.random(), np.random.randn(), np.random.rand(), torch.rand(2))
    assert draws[:3] == again[:3] and torch.equal(draws[3], again[3])


def _fs_ops(monkeypatch, fail_at: int | None):
    """Count os.replace / os.rename / os.fsync / shutil.rmtree calls; raise at call ``fail_at`` (a crash there)."""
    calls = []

    def wrap(fn):
        def op(*args, **kwargs):
            calls.append(fn.__name__)
            if fail_at is not None and len(calls) - 1 == fail_at:
                raise KeyboardInterrupt(f"crash at {fn.__name__} #{fail_at}")
            return fn(*args, **kwargs)
        return op

    for mod, name in ((os, "replace"), (os, "rename"), (os, "fsync"), (shutil, "rmtree")):
        monkeypatch.setattr(mod, name, wrap(getattr(mod, name)))
    return calls


@pytest.mark.slow
@pytest.mark.parametrize("before", ["step2", "step4_only", "step2_step4_corrupt"])
def test_a_crash_at_any_point_of_a_save_leaves_a_complete_checkpoint(tmp_path, monkeypatch, before):
    """Saving step 4 over: a complete step 2; a complete step 4 (written again); step 2 and a corrupt step 4."""
    model, tok, opt = _trained()
    base = tmp_path / "base"
    if before != "step4_only":
        save_checkpoint(base, 2, model, tok, opt, RunConfig())
    if before != "step2":
        save_checkpoint(base, 4, model, tok, opt, RunConfig())
    if before == "step2_step4_corrupt":
        (base / "checkpoints" / "step_000004" / "optimizer.pt").write_bytes(b"")
        (base / "checkpoints" / "latest").write_text("step_000002\n")  # the save of step 4 was cut before this
    shutil.copytree(base, tmp_path / "count")
    with monkeypatch.context() as m:
        calls = _fs_ops(m, None)
        save_checkpoint(tmp_path / "count", 4, model, tok, opt, RunConfig())
    total = len(calls)
    assert "replace" in calls, calls
    for k in range(total):
        run = tmp_path / f"crash{k}"
        shutil.copytree(base, run)
        with monkeypatch.context() as m:
            _fs_ops(m, k)
            with pytest.raises(KeyboardInterrupt):
                save_checkpoint(run, 4, model, tok, opt, RunConfig())
        ck = latest_checkpoint(run)
        assert ck is not None, f"a crash at file operation {k} left no complete checkpoint"
        model2, _, opt2 = _trained()
        assert load_checkpoint(ck, model2, opt2)["step"] in (2, 4)
        # the next save completes and clears whatever the crash left
        save_checkpoint(run, 4, model, tok, opt, RunConfig())
        names = sorted(p.name for p in (run / "checkpoints").iterdir() if not p.name.startswith(".tmp"))
        assert (run / "checkpoints" / "latest").read_text() == "step_000004\n"
        assert "step_000004" in names and not any(n.startswith(".replaced") for n in names), names
        check_checkpoint(run / "checkpoints" / "step_000004")


def test_latest_pointer_decides_and_older_complete_checkpoint_is_the_fallback(tmp_path):
    model, tok, opt = _trained()
    for step in (1, 2, 3):
        save_checkpoint(tmp_path, step, model, tok, opt, RunConfig(), keep=3)
    ckdir = tmp_path / "checkpoints"
    (ckdir / "step_000003" / "rng.pt").write_bytes(b"torn")
    lines = []
    assert latest_checkpoint(tmp_path, log=lines.append).name == "step_000002"
    assert len(lines) == 1 and "step_000003" in lines[0] and "rng.pt" in lines[0]
    lines.clear()
    model2, _, opt2 = _trained()
    assert resume_checkpoint(tmp_path, model2, opt2, log=lines.append)["step"] == 2
    assert "step_000003" in lines[0] and "resuming from" in lines[-1] and "step_000002" in lines[-1]
    # every checkpoint broken: none is loaded, said so; starting over moves them aside (none can be resumed later)
    for p in ckdir.glob("step_*"):
        (p / "model.safetensors").write_bytes(b"")
    lines.clear()
    assert resume_checkpoint(tmp_path, model2, opt2, log=lines.append) is None
    assert "starts over" in lines[-1]
    dest = discard_checkpoints(tmp_path, log=lines.append)
    assert dest.name.startswith("checkpoints.stale-") and not ckdir.exists()
    assert resume_checkpoint(tmp_path, model2, opt2) is None


# ---------------------------------------------------------------------------------------------- metrics log


def _write_lines(path, text):
    path.write_text(text)
    return path


def test_read_jsonl_tolerates_a_torn_last_line_only(tmp_path):
    good = '{"step": 0, "a": 1}\n{"step": 1, "a": 2.5}\n'
    p = _write_lines(tmp_path / "m.jsonl", good + '{"step": 2, "a": 0.12')
    torn = []
    assert read_jsonl(p, on_torn=torn.append) == [{"step": 0, "a": 1}, {"step": 1, "a": 2.5}]
    assert len(torn) == 1 and "line 3" in torn[0]
    _write_lines(p, good + "\x00" * 10)  # a tail of zeros after a power cut
    assert [r["step"] for r in read_jsonl(p)] == [0, 1]
    _write_lines(p, '{"step": 0}\n{"step": 1, "a"\n{"step": 2}\n')  # damage before the last line: said, not skipped
    with pytest.raises(ValueError, match="line 2"):
        read_jsonl(p)


@pytest.mark.parametrize("text, start, steps, said", [
    ('{"step": 0}\n{"step": 1}\n{"step": 2}\n{"step": 3, "x', 2, [0, 1, 2], "torn"),
    ('{"step": 0}\n{"step": 1}\n{"step": 2, "x', 1, [0, 1], "torn"),
    ('{"step": 0}\n{"step": 1}\n{"step": 2}', 2, [0, 1, 2], None),  # last line complete but its newline lost
    ('{"step": 0}\n{"step": 1, "v": 1}\n{"step": 1, "v": 2}\n{"step": 2}\n', 1, [0, 1], "twice"),
    ('{"step": 0}\n{"step": 1}\n{"step": 2}\n', -1, [], None),  # started over: nothing of the earlier attempt
    ('{"step": 0}\n{"step": 1}\n', 5, [0, 1], None),
])
def test_truncate_after_keeps_every_earlier_record_once(tmp_path, capsys, text, start, steps, said):
    _write_lines(tmp_path / "metrics.jsonl", text)
    logger = RunLogger(tmp_path, progress=False)
    logger.truncate_after(start)
    lines = capsys.readouterr().err.splitlines()
    kept = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in kept] == steps
    if said:
        assert len(lines) == 1 and said in lines[0]
    else:
        assert lines == []
    logger.log({"step": max(steps, default=-1) + 1})
    assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == steps + [max(steps, default=-1) + 1]
    if "twice" in (said or ""):
        assert kept[1]["v"] == 2  # the last record of a step recorded twice


@pytest.mark.parametrize("start, steps, shown", [
    (0, [0, 1, 2, 3], 3),  # the step-0 evaluation is not a training step
    (2, [3, 4], 4),  # a resumed run's bar goes on from its checkpoint's step
])
def test_progress_bar_counts_training_steps(tmp_path, start, steps, shown):
    logger = RunLogger(tmp_path, progress_total=4, start=start)
    for s in steps:
        logger.log({"step": s})
    assert logger._bar.n == shown
    logger.close()


# ---------------------------------------------------------------------------------------------- resume on the toy env

TOY = ["env.name=toy", "env.max_turns=4", "env.num_train_tasks=16", "env.num_eval_tasks=4", "env.env_kwargs={length: 2}",
       "model.vocab_size=300", "model.hidden_size=32", "model.intermediate_size=64", "model.num_heads=2",
       "model.num_kv_heads=1", "warm_start.num_demos=16", "warm_start.steps=6", "warm_start.episodes_per_microbatch=8",
       "train.tasks_per_step=2", "train.episodes_per_task=2", "train.progress=false", "rollout.max_action_tokens=4",
       "train.steps=2", "train.checkpoint_every_steps=1", "train.eval_every_steps=2"]


def _strip(recs):
    return [{k: v for k, v in r.items() if not k.startswith("time/") and k != "sync/seconds"} for r in recs]


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    """An uninterrupted 2-step run (checkpoints at steps 1 and 2) and the policy it started from."""
    from interq.train.config import build_config
    from interq.train.pipeline import prepare_policy, run_training

    root = tmp_path_factory.mktemp("resume")
    policy, _ = prepare_policy(build_config("q-interq", TOY), root / "policy", log=lambda *_: None)
    recs = run_training(build_config("q-interq", TOY), root / "full", policy, log=lambda *_: None)
    assert [r["step"] for r in recs] == [0, 1, 2]
    return root / "full", policy, recs


def _rerun(run_dir, policy):
    from interq.train.config import build_config
    from interq.train.pipeline import run_training

    return run_training(build_config("q-interq", TOY), run_dir, policy, log=lambda *_: None)


@pytest.mark.parametrize("name, damage", [("model.safetensors", "truncate"), ("optimizer.pt", "flip"),
                                          ("rng.pt", "delete")])
def test_damaged_latest_checkpoint_falls_back_and_matches_uninterrupted(full_run, tmp_path, capsys, name, damage):
    full, policy, recs = full_run
    run = tmp_path / "run"
    shutil.copytree(full, run)
    target = run / "checkpoints" / "step_000002" / name
    data = target.read_bytes()
    if damage == "truncate":
        target.write_bytes(data[: len(data) // 3])
    elif damage == "flip":
        target.write_bytes(data[:-9] + bytes([data[-9] ^ 0x55]) + data[-8:])
    else:
        target.unlink()
    resumed = _rerun(run, policy)
    err = capsys.readouterr().err
    assert "step_000002" in err and name in err and "resuming from" in err and "step_000001" in err, err
    assert [r["step"] for r in resumed] == [0, 1, 2]
    assert _strip(resumed) == _strip(recs)
    check_checkpoint(run / "checkpoints" / "step_000002")  # written again, complete
    assert json.loads((run / "checkpoints" / "step_000002" / "state.json").read_text())["step"] == 2


def test_torn_metrics_line_resumes_without_a_lost_or_duplicated_step(full_run, tmp_path, capsys):
    """The crash: step 2's line half-written, its checkpoint never made."""
    full, policy, recs = full_run
    run = tmp_path / "run"
    shutil.copytree(full, run)
    shutil.rmtree(run / "checkpoints" / "step_000002")
    (run / "checkpoints" / "latest").write_text("step_000001\n")
    lines = (run / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(ln)["step"] for ln in lines] == [0, 1, 2]
    (run / "metrics.jsonl").write_text(lines[0] + "\n" + lines[1] + "\n" + lines[2][: len(lines[2]) // 2])
    assert [r["step"] for r in read_jsonl(run / "metrics.jsonl")] == [0, 1]  # readable meanwhile
    resumed = _rerun(run, policy)
    err = capsys.readouterr().err
    assert "torn last line" in err, err
    assert [r["step"] for r in resumed] == [0, 1, 2]
    assert [r["step"] for r in read_jsonl(run / "metrics.jsonl")] == [0, 1, 2]
    assert _strip(resumed) == _strip(recs)


def test_a_finished_run_kept_without_its_checkpoints_is_reused_not_trained_again(full_run, tmp_path, capsys):
    """A study's run directories kept as records only (config, provenance, metrics; no checkpoints) count as
    finished when their records reach train.steps: a rerun returns them and trains nothing; records that stop short
    start over as before."""
    full, policy, recs = full_run
    run = tmp_path / "run"
    shutil.copytree(full, run)
    shutil.rmtree(run / "checkpoints")
    before = (run / "metrics.jsonl").read_bytes()
    again = _rerun(run, policy)
    assert "finished, reused as it is" in capsys.readouterr().err
    assert again == read_jsonl(run / "metrics.jsonl") and (run / "metrics.jsonl").read_bytes() == before
    assert not (run / "checkpoints").exists()  # nothing was trained or saved
    short = tmp_path / "short"
    shutil.copytree(full, short)
    shutil.rmtree(short / "checkpoints")
    lines = (short / "metrics.jsonl").read_text().splitlines()
    (short / "metrics.jsonl").write_text("\n".join(lines[:2]) + "\n")  # steps 0 and 1 of 2
    redone = _rerun(short, policy)
    assert "reused" not in capsys.readouterr().err
    assert [r["step"] for r in redone] == [0, 1, 2] and _strip(redone) == _strip(recs)  # trained again from step 0


def test_machine_log_says_which_machine_made_which_steps(full_run, tmp_path):
    """machine.jsonl: one line per start of training with the step it starts from and the CPU it runs on; a resume
    adds a line, a resume that drops an earlier attempt's steps drops that attempt's line too."""
    import torch

    from interq.machine import cpu_capability

    full, policy, _ = full_run
    (line,) = read_jsonl(full / "machine.jsonl")
    assert line["start_step"] == 0 and line["torch"] == torch.__version__ and line["device"] == "cpu"
    assert line["cpu_class"] == cpu_capability()["cpu_class"] and line["threads"] == torch.get_num_threads()
    assert line["time"].endswith("+00:00")
    run = tmp_path / "run"
    shutil.copytree(full, run)

    def crash_after_step_1():  # step 2's checkpoint and record lost, as a kill before its save leaves them
        shutil.rmtree(run / "checkpoints" / "step_000002")
        (run / "checkpoints" / "latest").write_text("step_000001\n")
        lines = (run / "metrics.jsonl").read_text().splitlines()
        (run / "metrics.jsonl").write_text("\n".join(lines[:2]) + "\n")

    crash_after_step_1()
    _rerun(run, policy)
    assert [r["start_step"] for r in read_jsonl(run / "machine.jsonl")] == [0, 1]
    crash_after_step_1()  # the resumed attempt's step 2 is dropped again: its line goes, the new one replaces it
    _rerun(run, policy)
    assert [r["start_step"] for r in read_jsonl(run / "machine.jsonl")] == [0, 1]
