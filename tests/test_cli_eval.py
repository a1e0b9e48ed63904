"""``interq eval --policy DIR``: a saved policy on held-out tasks by the trainer's own evaluation. A checkpoint
evaluated under its run's config reproduces the run's held-out record at that step; the table, eval.json and the
RESULT line say the same; bad input is refused in one line before any work."""

from __future__ import annotations

import json

import pytest

from interq.cli import main

# a small household run (the default preset, q-interq: the W8A8-KV8 executor), evaluated after its one RL step
SMALL = ["env.name=household", "env.env_kwargs={split_sizes: {train: 24, valid_seen: 4, valid_unseen: 8}}",
         "env.num_train_tasks=24", "env.num_eval_tasks=8", "env.max_turns=5", "model.vocab_size=400",
         "model.hidden_size=32", "model.intermediate_size=64", "model.num_heads=2", "model.num_kv_heads=1",
         "warm_start.num_demos=48", "warm_start.steps=40", "warm_start.episodes_per_microbatch=16",
         "train.tasks_per_step=2", "train.episodes_per_task=2", "train.progress=false", "train.threads=1",
         "rollout.max_action_tokens=4", "train.steps=1", "train.eval_every_steps=1", "train.checkpoint_every_steps=1"]


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("eval") / "run"
    assert main(["train", "--out", str(run), *SMALL]) == 0
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return run, records[-1]


def _result(out: str) -> dict:
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    assert len(lines) == 1 and out.rstrip().splitlines()[-1] == lines[0]
    return json.loads(lines[0][len("RESULT "):])


@pytest.mark.slow
def test_eval_of_a_checkpoint_reproduces_its_runs_evaluation(trained_run, tmp_path, capsys):
    run, record = trained_run
    capsys.readouterr()
    out = tmp_path / "eval"
    assert main(["eval", "--policy", str(run), "--out", str(out), *SMALL]) == 0  # a run directory: its newest checkpoint
    printed = capsys.readouterr().out
    result = _result(printed)
    stored = json.loads((out / "eval.json").read_text())
    assert result["policy"] == str(run / "checkpoints" / "step_000001") == stored["policy"]
    assert result["episodes"] == 8 and result["executor"] == "w8a8" and result["env"] == "household"
    # the same policy, executor, tasks and episode seeds as the run's own evaluation at step 1
    assert stored["metrics"]["eval/outcomes"] == record["eval/outcomes"]
    for key in ("success", "return", "length", "invalid_frac"):
        assert stored["metrics"][f"eval/{key}"] == pytest.approx(record[f"eval/{key}"], rel=1e-12, abs=1e-12), key
        assert result[key] == pytest.approx(record[f"eval/{key}"], abs=1e-4), key
    assert "| policy | env | split | executor | episodes | success |" in printed
    assert (out / "config.yaml").is_file()


@pytest.mark.slow
def test_eval_with_another_executor_and_episode_count(trained_run, tmp_path, capsys):
    run, _ = trained_run
    out = tmp_path / "eval"
    policy = run / "checkpoints" / "step_000001"
    assert main(["eval", "--policy", str(policy), "--executor", "bf16", "--episodes", "3", "--out", str(out),
                 *SMALL]) == 0
    result = _result(capsys.readouterr().out)
    assert result["executor"] == "bf16" and result["episodes"] == 3 and result["tasks"] == 3
    stored = json.loads((out / "eval.json").read_text())
    assert len(stored["metrics"]["eval/outcomes"]) == 3 and stored["executor_info"]["executor"] == "bf16"
    assert 0.0 <= result["success"] <= 1.0


@pytest.mark.slow
def test_eval_notes_agent_settings_that_differ_from_the_policys(trained_run, tmp_path, capsys):
    run, _ = trained_run
    assert main(["eval", "--policy", str(run), "--out", str(tmp_path / "e"), "--episodes", "1", *SMALL,
                 "rollout.history_turns=0"]) == 0
    assert "rollout.history_turns: 1 -> 0" in capsys.readouterr().err


@pytest.mark.parametrize("args, needle", [
    (["--policy", "{tmp}/nothing"], "--policy="),
    (["--policy", "smollm2", "--episodes", "0"], "--episodes=0"),
    (["--policy", "smollm2", "env.name=nosuchenv"], "env.name"),
    (["--policy", "smollm2", "algo.correction=magic"], "algo.correction"),
    (["--policy", "smollm2", "env.num_eval_tasks=0"], "env.eval_split"),
])
def test_eval_refuses_bad_input_in_one_line_before_any_work(tmp_path, capsys, args, needle):
    out = tmp_path / "out"
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    assert main(["eval", "--out", str(out), *args, "env.max_turns=2"]) == 2
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("interq: ") and needle in lines[0], captured.err
    assert not out.exists()
