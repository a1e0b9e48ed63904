"""The warm start shipped for ``interq demo`` (interq/policies/household_text) and the demo's path through it."""

import json

import pytest

from interq.cli import main
from interq.train.experiments import DEMO_OVERRIDES, DEMO_POLICY, SETTINGS

FILES = {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
         "provenance.json", "policy_summary.json", "run_config.yaml", "README.md"}


def _demo_config(*overrides):
    from interq.train.config import build_config

    return build_config("household", [*DEMO_OVERRIDES, *overrides])


def test_the_study_settings_resolve_to_the_lists_its_runs_were_made_with():
    """The study's recorded runs resume and tabulate only under these exact override lists; the demo's settings
    may change, the study's may not."""
    base = ["env.task_types=pick_and_place", "env.env_kwargs={size: small, split_sizes: {valid_unseen: 600}}",
            "env.num_train_tasks=0", "env.num_eval_tasks=100", "rollout.max_action_tokens=4", "train.steps=20",
            "train.tasks_per_step=8", "train.eval_every_steps=10", "train.eval_episodes_per_task=1",
            "train.eval_temperature=0.5", "train.checkpoint_every_steps=10", "train.threads=1"]
    index = ["model.num_layers=4", "env.env_kwargs={size: small, split_sizes: {valid_seen: 1200, valid_unseen: 600}}",
             "env.eval_split=valid_seen", "env.num_eval_tasks=200", "train.eval_temperature=1.0",
             "train.episodes_per_task=8", "algo.advantage=gigpo", "optim.lr=3e-4", "train.steps=200",
             "train.eval_every_steps=25", "train.checkpoint_every_steps=25"]
    text = [*index, "env.action_format=text", "rollout.max_action_tokens=10"]
    assert SETTINGS["study-index"] == [*base, *index]
    assert SETTINGS["study"] == [*base, *text]
    assert SETTINGS["study-1k"][:len(base) + len(text)] == [*base, *text]


def test_the_demo_runs_the_study_text_setting_with_fewer_steps():
    demo, study = _demo_config(), _demo_config(*SETTINGS["study"])
    assert demo.train.steps < study.train.steps and demo.env.num_eval_tasks == 200
    assert (demo.env.action_format, demo.model.num_layers, demo.env.eval_split) == ("text", 4, "valid_seen")
    assert (demo.algo, demo.optim, demo.rollout, demo.model) == (study.algo, study.optim, study.rollout, study.model)
    assert demo.train.tasks_per_step == study.train.tasks_per_step
    assert demo.train.episodes_per_task == study.train.episodes_per_task


def test_the_shipped_policy_is_what_the_demo_settings_make_and_loads():
    """Its recorded inputs and numerics version are those of a warm start made now from the demo's settings (else
    the demo would not use it: re-make it as its README says), and it loads as a 4-layer text policy."""
    import torch

    from interq.train.policy import load_policy
    from interq.train.provenance import NUMERICS_VERSION, warm_start_differences, warm_start_identity

    assert {p.name for p in DEMO_POLICY.iterdir()} == FILES
    cfg = _demo_config()
    assert warm_start_differences(cfg, DEMO_POLICY) == []
    prov = json.loads((DEMO_POLICY / "provenance.json").read_text())
    assert prov == {"kind": "warm_start", **warm_start_identity(cfg)} and prov["numerics_version"] == NUMERICS_VERSION
    model, tok = load_policy(DEMO_POLICY)
    c = model.config
    assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.num_key_value_heads) == (
        cfg.model.num_layers, cfg.model.hidden_size, cfg.model.num_heads, cfg.model.num_kv_heads)
    summary = json.loads((DEMO_POLICY / "policy_summary.json").read_text())
    assert summary["policy"]["parameters"] == sum(p.numel() for p in model.parameters())
    assert summary["sft/steps"] == cfg.warm_start.steps
    ids = torch.tensor([tok.encode("You are in the middle of a room.")])
    with torch.no_grad():
        assert torch.isfinite(model(input_ids=ids).logits).all()
    readme = (DEMO_POLICY / "README.md").read_text()
    assert "interq demo --warm-start-only" in readme


def test_the_shipped_policy_is_package_data():
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    data = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["interq"]
    assert "policies/*/*" in data


@pytest.mark.slow
def test_the_demo_copies_the_shipped_warm_start_and_runs_from_it(tmp_path, capsys):
    """The demo's own path, cut to one RL step on a few tasks: the warm start is the shipped one (copied, marked),
    both arms train and evaluate, and the RESULT line carries the paired gain."""
    out = tmp_path / "demo"
    small = ["train.steps=1", "train.eval_every_steps=1", "train.checkpoint_every_steps=1", "env.num_eval_tasks=3",
             "train.tasks_per_step=1", "train.episodes_per_task=2", "train.progress=false"]
    assert main(["demo", "--out", str(out), "--jobs", "1", *small]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    res = json.loads(last[len("RESULT "):])
    assert res["warm_start"] == "shipped" and (out / "warm_start" / "shipped_from.txt").is_file()
    assert res["steps"] == 1 and res["policy_parameters"] > 0
    for arm in ("bf16", "q-interq"):
        assert res[arm]["eval_episodes"] == 3 and len(res[arm]["gain_ci95"]) == 2
    for f in ("demo.md", "demo.png", "mismatch.png", "summary.json", "bf16-s0/metrics.jsonl", "q-interq-s0/metrics.jsonl"):
        assert (out / f).is_file(), f
    assert "docs/results.md" in (out / "demo.md").read_text()
    # run again: everything is reused, nothing trains
    assert main(["demo", "--out", str(out), "--jobs", "1", *small]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1][len("RESULT "):])["warm_start"] == "shipped"


def test_warm_start_flag_moves_the_shipped_copy_aside(tmp_path):
    from interq.train.experiments import _demo_warm_start

    cfg, logs = _demo_config(), []
    assert _demo_warm_start(cfg, tmp_path, make=False, log=logs.append) == "shipped"
    assert (tmp_path / "warm_start" / "model.safetensors").read_bytes() == (DEMO_POLICY / "model.safetensors").read_bytes()
    assert _demo_warm_start(cfg, tmp_path, make=False, log=logs.append) == "shipped"  # the copy is reused
    assert _demo_warm_start(cfg, tmp_path, make=True, log=logs.append) == "made"
    assert not (tmp_path / "warm_start").exists() and len(list(tmp_path.glob("warm_start.stale-*"))) == 1
    # settings the shipped policy was not made from: the demo makes its own (a copy already there is moved aside)
    other = _demo_config("warm_start.steps=7")
    assert _demo_warm_start(other, tmp_path / "other", make=False, log=logs.append) == "made"
    assert "warm_start.steps" in logs[-1]
    assert _demo_warm_start(cfg, tmp_path, make=False, log=logs.append) == "shipped"
    assert _demo_warm_start(other, tmp_path, make=False, log=logs.append) == "made"
    assert not (tmp_path / "warm_start").exists() and len(list(tmp_path.glob("warm_start.stale-*"))) == 2


@pytest.mark.parametrize("jobs", ["0", "-1"])
def test_demo_refuses_a_bad_jobs_value(tmp_path, capsys, jobs):
    assert main(["demo", "--out", str(tmp_path / "d"), "--jobs", jobs]) == 2
    assert "--jobs" in capsys.readouterr().err and not (tmp_path / "d").exists()
