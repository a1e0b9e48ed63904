"""Fault injection: what a user, a crash or the machine can do to a run, each ending in a one-line refusal before
any work or in a correct, complete result.

Concurrent writers, stale locks, foreign and unusable output directories, damaged and foreign policies, a diverging
warm start, a non-finite RL loss, torn / missing / edited records, foreign checkpoints, a full disk during a save
(simulated: the write raises ENOSPC, since mounting a small file system needs privileges a test must not assume),
signals at several points, invalid environment switches, a stale kernel-build lock, and a SmolLM2-shaped warm start
under an address-space limit. Tiny runs (the toy environment, a 2-layer policy of 16 units), a few seconds each."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from interq.cli import main

TOY = ["env.name=toy", "env.max_turns=3", "env.num_train_tasks=8", "env.num_eval_tasks=2", "env.env_kwargs={length: 2}",
       "model.vocab_size=300", "model.hidden_size=16", "model.intermediate_size=32", "model.num_heads=2",
       "model.num_kv_heads=1", "model.head_dim=8", "warm_start.num_demos=8", "warm_start.steps=3",
       "train.tasks_per_step=2", "train.episodes_per_task=2", "train.progress=false", "rollout.max_action_tokens=3",
       "train.eval_every_steps=2", "train.checkpoint_every_steps=1", "train.threads=1", "train.steps=4"]
ROOT = Path(__file__).resolve().parents[1]


def _records(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]


def _strip(recs: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith("time/") and k != "sync/seconds"} for r in recs]


def _one_line_refusal(capsys, code, needle: str, rc: int = 2) -> str:
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if x.startswith("interq")]
    assert code == rc, err
    assert "Traceback" not in err, err
    assert len(lines) == 1 and needle in lines[0], err
    return lines[0]


@pytest.fixture(scope="module")
def policy(tmp_path_factory) -> Path:
    from interq.train.config import build_config
    from interq.train.pipeline import prepare_policy

    path, _ = prepare_policy(build_config("q-interq", TOY), tmp_path_factory.mktemp("faults") / "policy",
                             log=lambda *_: None)
    return path


@pytest.fixture(scope="module")
def reference(policy, tmp_path_factory) -> tuple[Path, list[dict]]:
    """An uninterrupted 4-step run from ``policy`` (checkpoints every step, the last two kept)."""
    run = tmp_path_factory.mktemp("faults_ref") / "run"
    assert main(["train", "--preset", "q-interq", "--policy", str(policy), "--out", str(run), *TOY]) == 0
    recs = _records(run)
    assert [r["step"] for r in recs] == [0, 1, 2, 3, 4]
    return run, recs


def _train(policy: Path, run: Path, *extra: str) -> int:
    return main(["train", "--preset", "q-interq", "--policy", str(policy), "--out", str(run), *TOY, *extra])


def _holder(directory: Path, hold_s: float = 60) -> subprocess.Popen:
    """Another process holding ``directory``'s lock (until killed)."""
    code = ("import sys, time; from interq import rundir; rundir.acquire(sys.argv[1], 'interq train (test holder)'); "
            "print('held', flush=True); time.sleep(float(sys.argv[2]))")
    p = subprocess.Popen([sys.executable, "-c", code, str(directory), str(hold_s)], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    return p


# ---------------------------------------------------------------------------------------------- one writer


def test_a_second_writer_is_refused_naming_the_holder_and_a_dead_holders_lock_is_taken_over(policy, reference,
                                                                                             tmp_path, capsys):
    run = tmp_path / "run"
    holder = _holder(run)
    try:
        line = _one_line_refusal(capsys, _train(policy, run), "is being written by")
        assert f"pid {holder.pid}" in line and "test holder" in line
        assert not run.exists()  # nothing was written
    finally:
        holder.kill()
        holder.wait()
    assert _train(policy, run) == 0  # the holder died: its lock is stale
    err = capsys.readouterr().err
    assert "taking over the lock" in err and f"pid {holder.pid}" in err
    assert _strip(_records(run)) == _strip(reference[1])
    assert not list(tmp_path.glob(".*.interq.lock"))  # released on exit


def test_a_run_inside_a_locked_directory_is_refused_but_the_holders_own_children_may_write_there(tmp_path, capsys):
    from interq import rundir

    top = tmp_path / "compare"
    holder = _holder(top)
    try:
        with pytest.raises(rundir.RunDirError, match=f"pid {holder.pid}"):
            rundir.acquire(top / "bf16-s0", "interq train")
    finally:
        holder.kill()
        holder.wait()
    # this process holds the top directory: a child process (a compare worker) locks a run directory inside it
    assert rundir.acquire(top, "interq compare")
    try:
        code = ("import sys; from interq import rundir; print(rundir.acquire(sys.argv[1], 'worker')); "
                "rundir.release(sys.argv[1])")
        out = subprocess.run([sys.executable, "-c", code, str(top / "bf16-s0")], capture_output=True, text=True)
        assert out.returncode == 0 and out.stdout.strip() == "True", out.stderr
    finally:
        rundir.release(top)


def test_the_same_process_may_take_a_directory_twice(tmp_path):
    from interq import rundir

    assert rundir.acquire(tmp_path / "x", "a") is True
    assert rundir.acquire(tmp_path / "x", "a") is False  # re-entrant
    assert rundir.acquire(tmp_path / "x" / "warm_start", "a") is False  # inside a directory this process holds
    rundir.release(tmp_path / "x")
    assert rundir.lock_path(tmp_path / "x").exists()
    rundir.release(tmp_path / "x")
    assert not rundir.lock_path(tmp_path / "x").exists()


# ---------------------------------------------------------------------------------------------- --out


def test_out_that_is_a_file_is_refused_before_any_work(policy, tmp_path, capsys):
    (tmp_path / "afile").write_text("mine")
    _one_line_refusal(capsys, _train(policy, tmp_path / "afile"), "is a file, not a directory")
    assert (tmp_path / "afile").read_text() == "mine"


def test_out_holding_the_users_files_is_refused_and_force_never_overwrites_them(policy, tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    _one_line_refusal(capsys, _train(policy, out), "did not write (notes.txt)")
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    (out / "metrics.jsonl").write_text("my own log\n")
    _one_line_refusal(capsys, _train(policy, out, "--force"), "would be overwritten")
    assert (out / "metrics.jsonl").read_text() == "my own log\n"
    (out / "metrics.jsonl").unlink()
    assert _train(policy, out, "--force") == 0  # beside the user's file, which is untouched
    assert (out / "notes.txt").read_text() == "mine" and len(_records(out)) == 5


def test_demo_out_with_the_users_summary_is_refused(tmp_path, capsys):
    out = tmp_path / "demo"
    out.mkdir()
    (out / "summary.json").write_text('{"mine": 1}')
    _one_line_refusal(capsys, main(["demo", "--out", str(out), *TOY]), "did not write (summary.json)")
    _one_line_refusal(capsys, main(["demo", "--out", str(out), "--force", *TOY]), "would be overwritten")
    assert (out / "summary.json").read_text() == '{"mine": 1}'
    assert sorted(p.name for p in out.iterdir()) == ["summary.json"]


@pytest.mark.parametrize("args, needle", [
    (["train", "--preset", ""], "expected a preset name"),
    (["train", "--preset", "q-interq", "train.seed=100000000000000000000"], "train.seed"),
    (["train", "--preset", "q-interq", "train.seed=1e20"], "train.seed"),
    (["train", "--preset", "q-interq", "warm_start.tokens_per_microbatch=-1"], "warm_start.tokens_per_microbatch"),
    (["compare", "--seeds", ""], "--seeds"),
    (["compare", "--seeds", "0", "--arms", ""], "--arms"),
])
def test_malformed_inputs_are_refused_before_any_work(tmp_path, capsys, args, needle):
    try:
        code = main([*args[:1], "--out", str(tmp_path / "x"), *args[1:], *TOY])
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err
    assert code == 2 and needle in err and "Traceback" not in err, err
    assert not (tmp_path / "x").exists()


# ---------------------------------------------------------------------------------------------- policies


def _damaged_policy(policy: Path, tmp_path: Path, how: str) -> Path:
    from safetensors.torch import load_file, save_file

    bad = tmp_path / f"policy_{how}"
    shutil.copytree(policy, bad)
    weights = bad / "model.safetensors"
    if how == "missing_tensor":
        d = load_file(weights)
        del d[next(k for k in d if "down_proj" in k)]
        save_file(d, weights, metadata={"format": "pt"})
    elif how == "truncated":
        weights.write_bytes(weights.read_bytes()[:5000])
    elif how == "config_json":
        (bad / "config.json").write_text("{not json")
    elif how == "no_tokenizer":
        for p in bad.glob("tokenizer*"):
            p.unlink()
    elif how == "other_width":
        d = load_file(weights)
        k = next(k for k in d if "down_proj" in k)
        d[k] = torch.zeros(d[k].shape[0], d[k].shape[1] + 8)
        save_file(d, weights, metadata={"format": "pt"})
    elif how == "nonfinite":
        d = load_file(weights)
        k = next(iter(d))
        d[k][0] = float("nan")
        save_file(d, weights, metadata={"format": "pt"})
    elif how == "not_safetensors":
        weights.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!" + bytes(64))
    return bad


@pytest.mark.parametrize("how, needle", [
    ("missing_tensor", "down_proj"), ("truncated", "truncated"), ("config_json", "config.json"),
    ("no_tokenizer", "no tokenizer"), ("other_width", "other shapes"), ("nonfinite", "NaN or infinite"),
    ("not_safetensors", "not a safetensors file"),
])
def test_damaged_or_foreign_policy_is_refused_in_one_line_before_any_work(policy, tmp_path, capsys, how, needle):
    bad = _damaged_policy(policy, tmp_path, how)
    _one_line_refusal(capsys, _train(bad, tmp_path / "run"), needle)
    assert not (tmp_path / "run").exists()


def test_damaged_policy_is_refused_by_mismatch_too(policy, tmp_path, capsys):
    bad = _damaged_policy(policy, tmp_path, "missing_tensor")
    with pytest.raises(SystemExit) as e:
        main(["mismatch", "--preset", "q-interq", "--policy", str(bad), "--out", str(tmp_path / "m"), *TOY])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "down_proj" in err and "Traceback" not in err


def test_mismatch_without_a_policy_says_first_that_it_warm_starts(tmp_path, capsys):
    assert main(["mismatch", "--preset", "q-interq", "--episodes", "2", "--out", str(tmp_path / "m"), *TOY]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("[mismatch] no --policy: this first warm-starts tiny")


# ---------------------------------------------------------------------------------------------- non-finite


def test_a_diverging_warm_start_saves_nothing_and_stops_in_one_line(tmp_path, capsys):
    code = main(["sft", "--preset", "q-interq", "--out", str(tmp_path / "ws"), *TOY, "warm_start.lr=1e9"])
    line = _one_line_refusal(capsys, code, "the warm start diverged", rc=3)
    assert "warm_start.lr" in line
    assert not (tmp_path / "ws").exists() and not list(tmp_path.glob(".ws.*"))


def test_non_finite_weights_are_never_saved(tmp_path):
    from interq.train.config import ModelConfig
    from interq.train.policy import NonFiniteWeightsError, build_tiny_policy, save_policy

    model, tok = build_tiny_policy(ModelConfig(vocab_size=300, hidden_size=16, intermediate_size=32, num_heads=2,
                                               num_kv_heads=1, head_dim=8), ["go to fridge 1", "open it"] * 20)
    with torch.no_grad():
        next(model.parameters())[0, 0] = float("inf")
    with pytest.raises(NonFiniteWeightsError, match="not finite"):
        save_policy(model, tok, tmp_path / "p")
    assert not (tmp_path / "p").exists()


def test_a_non_finite_rl_loss_stops_the_run_at_that_step(policy, tmp_path, monkeypatch, capsys):
    from interq.algo import loss as loss_mod

    orig = loss_mod.ppo_loss
    calls = {"n": 0}

    def poisoned(*a, **k):  # step 2's loss (and later ones) is NaN
        calls["n"] += 1
        loss, m = orig(*a, **k)
        return (loss * float("nan"), m) if calls["n"] > 1 else (loss, m)

    monkeypatch.setattr(loss_mod, "ppo_loss", poisoned)
    line = _one_line_refusal(capsys, _train(policy, tmp_path / "run"), "stopped at step 2", rc=3)
    assert "policy loss is nan" in line
    assert [r["step"] for r in _records(tmp_path / "run")] == [0, 1, 2]
    assert (tmp_path / "run" / "checkpoints" / "latest").read_text().strip() == "step_000001"


# ---------------------------------------------------------------------------------------------- records


def test_a_torn_record_before_every_checkpoint_is_refused_with_the_command_that_recomputes_it(policy, reference,
                                                                                             tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(reference[0], run)
    lines = (run / "metrics.jsonl").read_text().splitlines()
    lines[2] = lines[2][:25]  # step 2's record torn (the kept checkpoints are steps 3 and 4)
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    before = (run / "metrics.jsonl").read_text()
    line = _one_line_refusal(capsys, _train(policy, run, "train.steps=5"), "lacks the records of steps 2")
    assert line.rstrip().endswith("--no-resume") and "nothing was changed" in line
    assert (run / "metrics.jsonl").read_text() == before
    assert _train(policy, run, "train.steps=4", "--no-resume") == 0  # the repair: recomputed from step 0
    assert _strip(_records(run)) == _strip(reference[1])


def test_a_deleted_log_is_refused_not_resumed_without_records(policy, reference, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(reference[0], run)
    (run / "metrics.jsonl").unlink()
    _one_line_refusal(capsys, _train(policy, run), "lacks the records of steps 0-4")


@pytest.mark.parametrize("lost", [4])
def test_a_lost_record_after_a_checkpoint_is_recomputed_from_that_checkpoint(policy, reference, tmp_path, capsys, lost):
    run = tmp_path / "run"
    shutil.copytree(reference[0], run)
    kept = [x for x in (run / "metrics.jsonl").read_text().splitlines() if json.loads(x)["step"] != lost]
    (run / "metrics.jsonl").write_text("\n".join(kept) + "\n")
    assert _train(policy, run) == 0
    assert "resuming from" in capsys.readouterr().err
    assert _strip(_records(run)) == _strip(reference[1])  # one record per step, the same numbers


def test_a_duplicated_and_an_edited_line_keep_one_record_per_step(policy, reference, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(reference[0], run)
    lines = (run / "metrics.jsonl").read_text().splitlines()
    (run / "metrics.jsonl").write_text("\n".join([lines[0], lines[1], lines[1], "[1, 2]", *lines[2:]]) + "\n")
    assert _train(policy, run, "train.steps=5") == 0
    steps = [r["step"] for r in _records(run)]
    assert steps == [0, 1, 2, 3, 4, 5]


def test_a_foreign_checkpoint_is_skipped_without_touching_the_model(tmp_path):
    from interq.train.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
    from interq.train.config import ModelConfig, RunConfig
    from interq.train.policy import build_tiny_policy

    texts = ["go to fridge 1", "open fridge 1"] * 20
    mk = lambda h: build_tiny_policy(ModelConfig(vocab_size=300, hidden_size=h, intermediate_size=32, num_heads=2,  # noqa: E731
                                                 num_kv_heads=1, head_dim=8), texts)
    other, tok = mk(24)
    path = save_checkpoint(tmp_path, 1, other, tok, None, RunConfig())
    model, _ = mk(16)
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(CheckpointError, match="does not match the model"):
        load_checkpoint(path, model)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


# ---------------------------------------------------------------------------------------------- disk full


def test_a_full_disk_during_a_checkpoint_stops_in_one_line_and_the_run_resumes_complete(policy, reference, tmp_path,
                                                                                        monkeypatch, capsys):
    """ENOSPC simulated (torch.save of the optimizer state raises it at step 3's checkpoint): mounting a small file
    system needs privileges this suite does not assume."""
    from interq.train import checkpoint as ck

    real = torch.save
    state = {"n": 0}

    def full(obj, f, *a, **k):
        if str(f).endswith("optimizer.pt"):
            state["n"] += 1
            if state["n"] == 3:
                with open(f, "wb") as fh:
                    fh.write(b"partial")
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(f))
        return real(obj, f, *a, **k)

    monkeypatch.setattr(ck.torch, "save", full)
    run = tmp_path / "run"
    line = _one_line_refusal(capsys, _train(policy, run), "checkpoint of step 3 could not be written")
    assert "No space left on device" in line
    assert (run / "checkpoints" / "latest").read_text().strip() == "step_000002"
    assert not list((run / "checkpoints").glob(".tmp_*"))
    monkeypatch.setattr(ck.torch, "save", real)
    assert _train(policy, run) == 0
    assert _strip(_records(run)) == _strip(reference[1])


# ---------------------------------------------------------------------------------------------- signals


@pytest.mark.slow
@pytest.mark.parametrize("sig, seed", [(signal.SIGTERM, 0), (signal.SIGINT, 1), (signal.SIGTERM, 2)])
def test_a_signal_ends_the_run_in_one_line_with_the_resume_command_and_the_resumed_run_is_complete(
        policy, tmp_path, sig, seed):
    """The signal comes at a random moment (seeded) after the run has logged its first records: in a rollout, an
    update, an evaluation, a checkpoint or a log write."""
    import random

    run = tmp_path / "run"
    args = ["train", "--preset", "q-interq", "--policy", str(policy), "--out", str(run), *TOY, "train.steps=40"]
    env = {**os.environ, "INTERQ_ALLOCATOR": "system", "OMP_NUM_THREADS": "1"}
    p = subprocess.Popen([sys.executable, "-m", "interq", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=env, cwd=ROOT)
    t0 = time.monotonic()
    while time.monotonic() - t0 < 120 and p.poll() is None:
        if (run / "metrics.jsonl").exists() and len((run / "metrics.jsonl").read_text().splitlines()) >= 2:
            break
        time.sleep(0.05)
    time.sleep(random.Random(seed).uniform(0.0, 1.5))
    p.send_signal(sig)
    out, err = p.communicate(timeout=120)
    assert "Traceback" not in err, err
    if p.returncode != 0:  # (0: the run ended before the signal came)
        assert p.returncode == (143 if sig == signal.SIGTERM else 130), err
        line = [x for x in err.splitlines() if x.startswith("interq")]
        assert len(line) == 1 and "stopped by" in line[0] and "resume with: interq train" in line[0], err
    assert not list(tmp_path.glob(".*.interq.lock"))
    assert _train(policy, run, "train.steps=40") == 0  # resumed: every step recorded once
    assert [r["step"] for r in _records(run)] == list(range(41))


# ---------------------------------------------------------------------------------------------- switches


@pytest.mark.parametrize("env, needle", [({"INTERQ_CPU_KERNELS": "maybe"}, "INTERQ_CPU_KERNELS='maybe'"),
                                         ({"INTERQ_FAST_LAYERS": "2"}, "INTERQ_FAST_LAYERS"),
                                         ({"INTERQ_ALLOCATOR": "tcmalloc"}, "INTERQ_ALLOCATOR"),
                                         ({"INTERQ_CPU_KERNEL": "0"}, "not one of interq's switches")])
def test_environment_switches_take_only_their_documented_values(env, needle):
    from interq import switches

    with pytest.raises(switches.SwitchError, match=needle):
        switches.check_environment(env)
    switches.check_environment({"INTERQ_CPU_KERNELS": "off", "INTERQ_FAST_LAYERS": "Yes", "INTERQ_ALLOCATOR": "system"})
    assert switches.flag("INTERQ_CPU_KERNELS", {"INTERQ_CPU_KERNELS": "off"}) is False


def test_the_verl_align_switch_takes_every_preset_of_the_verl_engine():
    from interq import switches
    from interq.integrations.verl.engine import PRESETS

    assert switches.VERL_ALIGN_PRESETS == tuple(PRESETS)
    for name in PRESETS:
        switches.check_environment({"INTERQ_VERL_ALIGN": name})
    switches.check_environment({"INTERQ_VERL_ALIGN": '{"w_format": "int8"}'})
    with pytest.raises(switches.SwitchError, match="w8a8_int8_kv_int8"):
        switches.check_environment({"INTERQ_VERL_ALIGN": "w4a4"})


def test_an_invalid_switch_stops_the_command_in_one_line(tmp_path):
    env = {**os.environ, "INTERQ_CPU_KERNELS": "maybe"}
    p = subprocess.run([sys.executable, "-m", "interq", "train", "--out", str(tmp_path / "r"), *TOY], env=env,
                       capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 2 and "INTERQ_CPU_KERNELS='maybe'" in p.stderr and "Traceback" not in p.stderr
    assert not (tmp_path / "r").exists()


@pytest.mark.slow
def test_a_kernels_directory_that_is_a_file_is_said_once(tmp_path):
    (tmp_path / "k").write_text("")
    code = "from interq import kernels; print(kernels.load()); print(kernels.load())"
    p = subprocess.run([sys.executable, "-c", code], env={**os.environ, "INTERQ_KERNELS_DIR": str(tmp_path / "k")},
                       capture_output=True, text=True)
    assert p.returncode == 0 and p.stdout.split() == ["None", "None"]
    assert p.stderr.count("is a file, not a directory") == 1


def test_a_stale_kernel_build_lock_is_taken_over_with_a_message(tmp_path, capsys):
    from interq import kernels

    (tmp_path / "lock").write_text("")  # torch's build lock, left by a killed build
    with kernels._build_lock(tmp_path):
        assert not (tmp_path / "lock").exists()
    assert "whose owner has ended" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------- memory


MEMORY_PROBE = r"""
import resource, sys
import torch
from transformers import AutoModelForCausalLM, LlamaConfig
from interq.train.config import WarmStartConfig
from interq.train.sft import run_sft

budget, limit_mib = int(sys.argv[1]), int(sys.argv[2])
torch.manual_seed(0)
# SmolLM2-135M's layer and vocabulary (Llama, hidden 576, 9 heads / 3 KV heads, MLP 1536, 49,152 tokens, tied
# embeddings), 2 of its 30 layers
cfg = LlamaConfig(hidden_size=576, intermediate_size=1536, num_hidden_layers=2, num_attention_heads=9,
                  num_key_value_heads=3, vocab_size=49152, tie_word_embeddings=True, max_position_embeddings=2048)
model = AutoModelForCausalLM.from_config(cfg)
g = torch.Generator().manual_seed(0)
rows = [(torch.randint(0, 49152, (256,), generator=g).tolist(), [i % 3 == 0 for i in range(256)]) for _ in range(8)]
w = WarmStartConfig(steps=1, num_demos=8, episodes_per_microbatch=8, observation_weight=1.0, lr=1e-4)
vm = next(int(x.split()[1]) for x in open("/proc/self/status") if x.startswith("VmSize")) // 1024
resource.setrlimit(resource.RLIMIT_AS, ((vm + limit_mib) * 2**20, resource.RLIM_INFINITY))
try:
    out = run_sft(model, rows, w, 0, tokens_per_microbatch=budget, checkpoint_layers=budget > 0)
    print("ok", out["sft/forwards"], out["sft/peak_rss_mib"])
except (MemoryError, RuntimeError) as e:
    print("out of memory", type(e).__name__)
"""


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc and limits the address space (Linux)")
def test_a_smollm2_shaped_warm_start_fits_its_memory_limit_by_its_token_budget():
    """The same step under the same address-space limit (900 MiB above what the set-up maps): 8 rows of 256 tokens in
    one forward (the logits alone, 2,048 x 49,152 floats, three times over) do not fit; micro-batches of 256 tokens
    with the layers recomputed in the backward do."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = lambda budget: subprocess.run([sys.executable, "-c", MEMORY_PROBE, str(budget), "900"], env=env,  # noqa: E731
                                        capture_output=True, text=True, timeout=300).stdout.split()
    fits = run(256)
    assert fits[:2] == ["ok", "8"], fits
    assert run(0)[:3] == ["out", "of", "memory"]


def test_the_warm_starts_token_budget_splits_a_step_into_forwards_with_the_same_update_to_rounding():
    """0 (a tiny policy's default) and a budget the step fits in are the same single forward, bit for bit; a budget
    that splits the step into several forwards accumulates the same gradient up to float rounding."""
    import copy

    from interq.train.config import ModelConfig, WarmStartConfig
    from interq.train.policy import build_tiny_policy
    from interq.train.sft import pack_rows, resolve_tokens_per_microbatch, run_sft

    assert pack_rows([5, 9, 3, 7], 0) == [[0, 1, 2, 3]]
    assert pack_rows([5, 9, 3, 7], 18) == [[0, 1], [2, 3]] and pack_rows([50], 10) == [[0]]
    w = WarmStartConfig(steps=4, episodes_per_microbatch=12, observation_weight=1.0)
    assert resolve_tokens_per_microbatch(w, pretrained=False) == 0 and resolve_tokens_per_microbatch(w, True) == 4096
    model, _ = build_tiny_policy(ModelConfig(vocab_size=300, hidden_size=16, intermediate_size=32, num_heads=2,
                                             num_kv_heads=1, head_dim=8), ["go to fridge 1", "take apple 1"] * 30)
    g = torch.Generator().manual_seed(1)
    rows = []
    for _ in range(30):
        n = int(torch.randint(8, 60, (1,), generator=g))
        rows.append((torch.randint(1, model.config.vocab_size, (n,), generator=g).tolist(),
                     (torch.rand(n, generator=g) < 0.3).tolist()))
    runs = {}
    for budget in (0, 10_000, 150):
        m = copy.deepcopy(model)
        runs[budget] = (m, run_sft(m, rows, w, 0, tokens_per_microbatch=budget))
    assert runs[0][1]["sft/forwards"] == runs[10_000][1]["sft/forwards"] == 4 and runs[150][1]["sft/forwards"] > 8
    assert all(torch.equal(a, b) for a, b in zip(runs[0][0].parameters(), runs[10_000][0].parameters()))
    # float32 sums in another order: the loss to ~1e-6 relative, the weights (4 AdamW steps of lr 3e-3) to ~1e-5
    assert runs[150][1]["sft/final_loss"] == pytest.approx(runs[0][1]["sft/final_loss"], rel=1e-5)
    with torch.no_grad():
        assert max(float((a - b).abs().max()) for a, b in zip(runs[0][0].parameters(), runs[150][0].parameters())) < 1e-4
