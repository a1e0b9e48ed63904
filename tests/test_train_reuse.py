"""No stale result can pass for a new one: a warm start or run directory is reused only when it
was made from the same inputs by the same numerics; otherwise the CLI stops before any work and names every
differing field, and ``--fresh`` moves the stale directory aside and starts again."""

import json
import shutil

import pytest
import yaml

from interq.cli import main
from interq.train import provenance

TOY = ["env.name=toy", "env.max_turns=3", "env.num_train_tasks=8", "env.num_eval_tasks=2", "env.env_kwargs={length: 2}",
       "model.vocab_size=300", "model.hidden_size=16", "model.intermediate_size=32", "model.num_heads=2",
       "model.num_kv_heads=1", "model.head_dim=8", "warm_start.num_demos=8", "warm_start.steps=3",
       "train.tasks_per_step=2", "train.episodes_per_task=2", "train.progress=false", "rollout.max_action_tokens=3",
       "train.steps=2", "train.eval_every_steps=2", "train.checkpoint_every_steps=2", "train.threads=1"]


def _train(run, *extra, opts=()):
    """``interq train`` of the tiny q-interq run into ``run`` (options before the overrides)."""
    return ["train", "--preset", "q-interq", "--out", str(run), *opts, *TOY, *extra]


def _cli(capsys, args):
    """(exit code, stderr) of one CLI call."""
    capsys.readouterr()
    rc = main(args)
    return rc, capsys.readouterr().err


def _steps(run):
    return [json.loads(ln)["step"] for ln in (run / "metrics.jsonl").read_text().splitlines()]


def _stamps(run):
    """What a reuse must leave untouched: the warm start's weights and the run's last checkpoint (mtimes)."""
    return {"warm_start": (run / "warm_start" / "model.safetensors").stat().st_mtime_ns,
            "checkpoint": (run / "checkpoints" / "step_000002" / "model.safetensors").stat().st_mtime_ns}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One finished tiny run (warm start + 2 RL steps), copied by each test."""
    run = tmp_path_factory.mktemp("trained") / "run"
    assert main(_train(run)) == 0
    return run


@pytest.fixture
def run(trained, tmp_path):
    dst = tmp_path / "run"
    shutil.copytree(trained, dst)
    return dst


def test_identical_rerun_reuses_warm_start_and_run(run, capsys):
    stamps, metrics = _stamps(run), (run / "metrics.jsonl").read_text()
    rc, err = _cli(capsys, _train(run))
    assert rc == 0, err
    assert _stamps(run) == stamps  # neither retrained
    assert (run / "metrics.jsonl").read_text() == metrics
    # both record what they were computed from, numerics version included
    ws = json.loads((run / "warm_start" / "provenance.json").read_text())
    assert ws["numerics_version"] == provenance.NUMERICS_VERSION and ws["inputs"]["warm_start.steps"] == 3
    rr = json.loads((run / "provenance.json").read_text())
    assert rr["numerics_version"] == provenance.NUMERICS_VERSION and rr["start_policy"]["inputs"] == ws["inputs"]


@pytest.mark.parametrize("change, expected, warm_start_differs", [
    ("algo.budget=0.25", "algo.budget: 0.5 -> 0.25", False),
    ("algo.correction=tis", "algo.correction: interq -> tis", False),
    ("warm_start.steps=4", "warm_start.steps: 3 -> 4", True),
    ("model.hidden_size=32", "model.hidden_size: 16 -> 32", True),
    ("env.max_turns=4", "env.max_turns: 3 -> 4", True),
    ("env.num_eval_tasks=3", "env.num_eval_tasks: 2 -> 3", False),  # held-out set: the warm start does not read it
])
def test_changed_config_refused_before_any_work(run, capsys, change, expected, warm_start_differs):
    stamps, metrics = _stamps(run), (run / "metrics.jsonl").read_text()
    config = (run / "config.yaml").read_text()
    rc, err = _cli(capsys, _train(run, change))
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("interq: "), err
    assert f"{run} holds results of other inputs" in err and "--fresh" in err
    assert expected in err
    assert (f"{run / 'warm_start'} holds results" in err) is warm_start_differs
    # nothing was touched: the stored config is the old one, nothing retrained or appended
    assert (run / "config.yaml").read_text() == config
    assert (run / "metrics.jsonl").read_text() == metrics and _stamps(run) == stamps
    assert not list(run.parent.glob("run.stale-*"))


def test_every_differing_field_is_named(run, capsys):
    rc, err = _cli(capsys, _train(run, "algo.budget=0.25", "optim.lr=0.001", "train.seed=3"))
    assert rc == 2
    for needle in ("algo.budget: 0.5 -> 0.25", "optim.lr: 0.0001 -> 0.001", "train.seed: 0 -> 3"):
        assert needle in err, err


def test_changed_warm_start_refused_by_sft(run, capsys):
    ws = run / "warm_start"
    before = (ws / "model.safetensors").stat().st_mtime_ns
    rc, err = _cli(capsys, ["sft", "--preset", "q-interq", "--out", str(ws), *TOY, "warm_start.noise=0.5"])
    assert rc == 2 and f"{ws} holds results of other inputs (warm_start.noise: 0.1 -> 0.5)" in err, err
    assert (ws / "model.safetensors").stat().st_mtime_ns == before
    # inputs the warm start does not read do not make it stale
    rc, err = _cli(capsys, ["sft", "--preset", "q-interq", "--out", str(ws), *TOY, "algo.budget=0.1", "optim.lr=0.5"])
    assert rc == 0, err
    assert (ws / "model.safetensors").stat().st_mtime_ns == before


def test_fresh_moves_stale_run_aside_and_keeps_matching_warm_start(run, capsys):
    ws_stamp = _stamps(run)["warm_start"]
    old_config = (run / "config.yaml").read_text()
    rc, err = _cli(capsys, _train(run, "algo.budget=0.25", opts=["--fresh"]))
    assert rc == 0, err
    (stale,) = run.parent.glob("run.stale-*")
    assert (stale / "config.yaml").read_text() == old_config and (stale / "metrics.jsonl").is_file()
    assert not (stale / "warm_start").exists()
    assert yaml.safe_load((run / "config.yaml").read_text())["algo"]["budget"] == 0.25
    assert _steps(run) == [0, 1, 2]
    assert (run / "warm_start" / "model.safetensors").stat().st_mtime_ns == ws_stamp  # it matched: reused


def test_fresh_retrains_a_stale_warm_start(run, capsys):
    stamps = _stamps(run)
    rc, err = _cli(capsys, _train(run, "warm_start.steps=4", opts=["--fresh"]))
    assert rc == 0, err
    assert json.loads((run / "warm_start" / "provenance.json").read_text())["inputs"]["warm_start.steps"] == 4
    assert json.loads((run / "warm_start" / "policy_summary.json").read_text())["sft/steps"] == 4
    (stale,) = run.parent.glob("run.stale-*")
    assert (stale / "warm_start" / "model.safetensors").stat().st_mtime_ns == stamps["warm_start"]
    assert _steps(run) == [0, 1, 2]


def test_extending_steps_resumes_shortening_refused(run, capsys):
    metrics = (run / "metrics.jsonl").read_text()
    # display-only fields may change, and train.steps may grow: the run continues from its step-2 checkpoint
    rc, err = _cli(capsys, _train(run, "train.steps=3", "train.progress=true"))
    assert rc == 0, err
    assert _steps(run) == [0, 1, 2, 3]
    assert (run / "metrics.jsonl").read_text().startswith(metrics)  # steps 0-2 kept as they were
    assert yaml.safe_load((run / "config.yaml").read_text())["train"]["steps"] == 3
    rc, err = _cli(capsys, _train(run, "train.steps=2"))
    assert rc == 2 and "train.steps: 3 -> 2" in err, err


def test_numerics_version_bump_refuses(run, capsys, monkeypatch):
    monkeypatch.setattr(provenance, "NUMERICS_VERSION", provenance.NUMERICS_VERSION + 1)
    new = provenance.NUMERICS_VERSION
    rc, err = _cli(capsys, _train(run))
    assert rc == 2
    assert f"{run / 'warm_start'} holds results of other inputs (numerics_version: {new - 1} -> {new})" in err, err
    assert f"{run} holds results of other inputs (numerics_version: {new - 1} -> {new})" in err, err


def test_result_without_provenance_refused(run, capsys):
    (run / "provenance.json").unlink()  # a run written before provenance was recorded
    rc, err = _cli(capsys, _train(run))
    assert rc == 2 and f"numerics_version: <unrecorded> -> {provenance.NUMERICS_VERSION}" in err, err


def test_other_start_policy_refused(run, tmp_path, capsys):
    ws = run / "warm_start"
    other = tmp_path / "other_policy"
    assert _cli(capsys, ["sft", "--preset", "q-interq", "--out", str(other), *TOY, "warm_start.seed=1"])[0] == 0
    rc, err = _cli(capsys, _train(tmp_path / "p", opts=["--policy", str(ws)]))
    assert rc == 0, err
    rc, err = _cli(capsys, _train(tmp_path / "p", opts=["--policy", str(other)]))
    assert rc == 2 and "start_policy.inputs.warm_start.seed: 0 -> 1" in err, err


def test_fresh_keeps_a_policy_inside_the_run_directory(run, capsys):
    ws = run / "warm_start"
    stamp = (ws / "model.safetensors").stat().st_mtime_ns
    rc, err = _cli(capsys, _train(run, "algo.budget=0.25", opts=["--policy", str(ws), "--fresh"]))
    assert rc == 0, err  # the run (started from the built-in warm start) is moved aside, its --policy stays
    assert (ws / "model.safetensors").stat().st_mtime_ns == stamp and _steps(run) == [0, 1, 2]


def test_sft_never_replaces_a_directory_that_is_no_warm_start(tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    rc, err = _cli(capsys, ["sft", "--preset", "q-interq", "--out", str(out), *TOY])
    assert rc == 2 and "not a warm start" in err and (out / "notes.txt").read_text() == "keep me"


def test_no_resume_starts_over_without_old_records(run, capsys):
    rc, err = _cli(capsys, _train(run, opts=["--no-resume"]))
    assert rc == 0, err
    assert _steps(run) == [0, 1, 2]  # no step-0 line of the earlier attempt left behind


CMP = ["env.name=toy", "env.task_types=", "env.max_turns=3", "env.num_train_tasks=8", "env.num_eval_tasks=2",
       "env.env_kwargs={length: 2}", "env.show_admissible=true", "algo.layout=concatenated",
       "model.vocab_size=300", "model.hidden_size=16", "model.intermediate_size=32", "model.num_heads=2",
       "model.num_kv_heads=1", "model.head_dim=8", "warm_start.num_demos=8", "warm_start.steps=2",
       "train.tasks_per_step=2", "train.episodes_per_task=2", "train.progress=false", "rollout.max_action_tokens=3",
       "train.steps=1", "train.eval_every_steps=1", "train.eval_episodes_per_task=1", "train.checkpoint_every_steps=1",
       "train.threads=1"]


@pytest.mark.slow
def test_compare_checks_every_arm_before_the_warm_start(tmp_path, capsys):
    out = tmp_path / "cmp"
    args = ["compare", "--out", str(out), "--arms", "bf16,q-interq", "--seeds", "0", *CMP]  # + overrides, then flags
    assert _cli(capsys, args)[0] == 0
    ws_stamp = (out / "warm_start" / "model.safetensors").stat().st_mtime_ns
    # a changed arm setting: refused naming every arm directory, before the warm start would be made
    shutil.move(out / "warm_start", tmp_path / "ws_saved")
    rc, err = _cli(capsys, [*args, "algo.budget=0.25"])
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    for arm in ("bf16-s0", "q-interq-s0"):
        assert f"{out / arm} holds results of other inputs (algo.budget: 0.5 -> 0.25)" in err, err
    assert not (out / "warm_start").exists()
    # the demo runs the same two arms: it refuses the same way
    rc, err = _cli(capsys, ["demo", "--out", str(out), *CMP, "algo.budget=0.25"])
    assert rc == 2 and f"{out / 'q-interq-s0'} holds results" in err and not (out / "warm_start").exists()
    # --fresh: the arms are moved aside and run again, the matching warm start is reused
    shutil.move(tmp_path / "ws_saved", out / "warm_start")
    rc, err = _cli(capsys, [*args, "algo.budget=0.25", "--fresh"])
    assert rc == 0, err
    assert (out / "warm_start" / "model.safetensors").stat().st_mtime_ns == ws_stamp
    assert len(list(out.glob("bf16-s0.stale-*"))) == 1 and len(list(out.glob("q-interq-s0.stale-*"))) == 1
    assert yaml.safe_load((out / "q-interq-s0" / "config.yaml").read_text())["algo"]["budget"] == 0.25


def test_saves_cut_by_a_kill_are_pruned_but_live_ones_kept(tmp_path, capsys):
    """A warm start killed while saving leaves ``.warm_start.PID.xxxx`` beside it; the next finished save removes
    those of dead processes, keeps one a live process is still writing, and never touches other names."""
    import os
    import subprocess

    dead = subprocess.Popen(["true"])
    dead.wait()
    leftovers = {"dead": tmp_path / f".warm_start.{dead.pid}.abc123", "live": tmp_path / f".warm_start.{os.getppid()}.x",
                 "legacy": tmp_path / ".warm_start.k3j2", "other": tmp_path / f".warm_starter.{dead.pid}.y"}
    for p in leftovers.values():
        p.mkdir()
        (p / "model.safetensors").write_bytes(b"partial")
    rc, _ = _cli(capsys, ["sft", "--preset", "q-interq", "--out", str(tmp_path / "warm_start"), *TOY])
    assert rc == 0 and (tmp_path / "warm_start" / "policy_summary.json").is_file()
    assert not leftovers["dead"].exists()
    assert all(leftovers[k].exists() for k in ("live", "legacy", "other"))
    assert not [p for p in tmp_path.glob(f".warm_start.{os.getpid()}.*")]  # the finished save's own temp is gone


def _as_version(out, version, names):
    """Rewrite stored results as a run of numerics ``version`` made before ``rollout.attention`` existed."""
    for name in names:
        prov = json.loads((out / name / "provenance.json").read_text())
        prov["numerics_version"] = version
        if "start_policy" in prov:
            prov["start_policy"]["numerics_version"] = version
            cfg = yaml.safe_load((out / name / "config.yaml").read_text())
            cfg["rollout"].pop("attention", None)
            (out / name / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
        (out / name / "provenance.json").write_text(json.dumps(prov))


@pytest.mark.slow
def test_report_only_reads_runs_of_an_older_numerics_version_and_says_so(tmp_path, capsys):
    """Runs of an older NUMERICS_VERSION (as the study's, version 1, transformers' sdpa attention then the default)
    refuse to resume, but ``compare --report-only`` tabulates them, naming the version and the defaults that moved;
    a field chosen differently, or a version newer than the code, still stops it."""
    out = tmp_path / "cmp"
    args = ["compare", "--out", str(out), "--arms", "bf16,q-interq", "--seeds", "0", *CMP]
    assert _cli(capsys, args)[0] == 0
    _as_version(out, 1, ["warm_start", "bf16-s0", "q-interq-s0"])
    now = provenance.NUMERICS_VERSION
    rc, err = _cli(capsys, args)
    assert rc == 2 and f"numerics_version: 1 -> {now}" in err and "rollout.attention: sdpa -> sdpa_packed" in err, err
    capsys.readouterr()
    assert main([*args, "--report-only"]) == 0
    result = json.loads(capsys.readouterr().out.splitlines()[-1].removeprefix("RESULT "))
    moved = ["rollout.attention: sdpa -> sdpa_packed"]
    assert result["older_numerics"] == {"bf16-s0": {"numerics_version": 1, "moved_defaults": moved},
                                        "q-interq-s0": {"numerics_version": 1, "moved_defaults": moved},
                                        "warm_start": {"numerics_version": 1, "moved_defaults": []}}
    assert "q-interq" in result["regimes"]["natural"]
    note = (out / "compare.md").read_text()
    assert f"computed under numerics version 1 (this code: {now})" in note and moved[0] in note, note
    assert main([*args, "rollout.attention=sdpa", "--report-only"]) == 0  # what they ran: nothing moved
    result = json.loads(capsys.readouterr().out.splitlines()[-1].removeprefix("RESULT "))
    assert result["older_numerics"]["q-interq-s0"] == {"numerics_version": 1, "moved_defaults": []}
    rc, err = _cli(capsys, [*args, "algo.budget=0.25", "--report-only"])  # another arm than the stored one
    assert rc == 2 and "algo.budget: 0.5 -> 0.25" in err and "numerics_version" not in err, err
    _as_version(out, now + 1, ["q-interq-s0"])  # a newer version than this code: not read
    rc, err = _cli(capsys, [*args, "--report-only"])
    assert rc == 2 and f"numerics_version: {now + 1} -> {now}" in err, err


@pytest.mark.slow
def test_report_only_names_the_value_to_pass_for_a_run_another_machine_resolved(tmp_path, capsys):
    """A run whose ``train.learner_autocast`` another CPU resolved otherwise: the report reads it and names the value
    to pass; resuming without that value is refused, and with it the finished run is reused as it is. The report
    also says on which machines the runs trained."""
    from interq.machine import cpu_capability

    out = tmp_path / "cmp"
    args = ["compare", "--out", str(out), "--arms", "bf16", "--seeds", "0", *CMP]
    assert _cli(capsys, args)[0] == 0
    stored = yaml.safe_load((out / "bf16-s0" / "config.yaml").read_text())
    here = stored["train"]["learner_autocast"]
    elsewhere = "off" if here != "off" else "bf16_backward"
    stored["train"]["learner_autocast"] = elsewhere
    (out / "bf16-s0" / "config.yaml").write_text(yaml.safe_dump(stored, sort_keys=False))
    metrics = (out / "bf16-s0" / "metrics.jsonl").read_text()
    assert main([*args, "--report-only"]) == 0
    said = capsys.readouterr()
    line = next(x for x in (said.out + said.err).splitlines() if x.startswith("[report] 1 runs record"))
    where = next(x for x in (said.out + said.err).splitlines() if x.startswith("[report] where the runs trained"))
    assert f"1 runs on {cpu_capability()['cpu']} ({cpu_capability()['cpu_class']})" in where, where
    assert (f"1 runs record train.learner_autocast={elsewhere}, which `auto` resolves to {here} on this machine" in line
            and f"pass train.learner_autocast={elsewhere}" in line), line
    rc, err = _cli(capsys, args)
    assert rc == 2 and f"train.learner_autocast: {elsewhere} -> {here}" in err, err
    assert _cli(capsys, [*args, f"train.learner_autocast={elsewhere}"])[0] == 0
    assert (out / "bf16-s0" / "metrics.jsonl").read_text() == metrics  # reused, not trained again


def test_a_field_a_run_does_not_record_counts_at_the_default_of_its_version(run):
    """The study's runs (version 1) do not record ``rollout.attention``: they ran transformers' ``sdpa``, the default
    then, and so differ from today's default (``sdpa_packed``) unless the difference is read for a report."""
    from interq.train.config import load_config

    cfg = load_config(run / "config.yaml")  # the run's own config: attention at today's default
    assert cfg.rollout.attention == "sdpa_packed"
    stored = yaml.safe_load((run / "config.yaml").read_text())
    del stored["rollout"]["attention"]
    (run / "config.yaml").write_text(yaml.safe_dump(stored, sort_keys=False))
    prov = json.loads((run / "provenance.json").read_text())
    (run / "provenance.json").write_text(json.dumps({**prov, "numerics_version": 1}))
    start = {**prov["start_policy"], "numerics_version": provenance.NUMERICS_VERSION}  # today's warm start
    diffs = provenance.run_differences(cfg, run, start)
    assert diffs[:2] == [f"numerics_version: 1 -> {provenance.NUMERICS_VERSION}", "rollout.attention: sdpa -> sdpa_packed"]
    assert provenance.run_differences(cfg, run, start, report=True) == []


def test_a_report_reads_a_run_whose_learner_settings_another_machine_resolved(run):
    """``train.learner_autocast`` / ``train.learner_attention`` are ``auto``, resolved by the CPU: a run made where
    they resolved otherwise cannot be resumed here (its numbers would change), but a report reads it and names
    the field; another value of an ordinary field still stops the report."""
    from interq.train.config import load_config

    cfg = load_config(run / "config.yaml")
    here = cfg.train.learner_autocast
    elsewhere = "off" if here != "off" else "bf16_backward"
    stored = yaml.safe_load((run / "config.yaml").read_text())
    stored["train"]["learner_autocast"] = elsewhere
    (run / "config.yaml").write_text(yaml.safe_dump(stored, sort_keys=False))
    start = json.loads((run / "provenance.json").read_text())["start_policy"]
    change = f"train.learner_autocast: {elsewhere} -> {here}"
    assert provenance.run_differences(cfg, run, start) == [change]
    assert provenance.run_differences(cfg, run, start, report=True) == []
    assert provenance.resolved_elsewhere(cfg, run) == [("train.learner_autocast", elsewhere, here)]
    stored["algo"]["budget"] = cfg.algo.budget + 0.125
    (run / "config.yaml").write_text(yaml.safe_dump(stored, sort_keys=False))
    diffs = provenance.run_differences(cfg, run, start, report=True)
    assert len(diffs) == 1 and diffs[0].startswith("algo.budget: "), diffs
