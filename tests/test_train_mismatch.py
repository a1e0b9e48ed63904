"""``interq mismatch``: its per-turn numbers are the trainer's logged metrics on the same episodes,
the per-turn profile curves against a naive loop, the CLI end to end, bad input rejected before any work."""

import json
import math

import pytest
import torch

from interq.algo.corrections import CorrectionConfig, compute_correction, interq_turn_profile
from interq.algo.metrics import turn_curve
from interq.cli import main
from interq.train.config import build_config
from interq.train.pipeline import prepare_policy, run_training

TOY = ["env.name=toy", "env.max_turns=3", "env.num_train_tasks=8", "env.num_eval_tasks=2", "env.env_kwargs={length: 2}",
       "model.vocab_size=300", "model.hidden_size=16", "model.intermediate_size=32", "model.num_heads=2",
       "model.num_kv_heads=1", "model.head_dim=8", "warm_start.num_demos=8", "warm_start.steps=3",
       "train.tasks_per_step=2", "train.episodes_per_task=2", "train.progress=false", "rollout.max_action_tokens=3",
       "train.threads=1"]
# one training step, nothing else; a budget small enough to bind on this policy's ~3e-4 nats per token
STEP = ["train.steps=1", "train.eval_every_steps=0", "train.checkpoint_every_steps=0", "algo.budget=0.0002"]


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory):
    path, _ = prepare_policy(build_config("q-interq", TOY), tmp_path_factory.mktemp("policy") / "p", log=lambda *_: None)
    return path


@pytest.mark.parametrize("arm, extra, learner", [
    ("q-interq", [], "aligned"),                                  # the preset: per-turn rows, aligned learner, InterQ
    ("q-tis", ["algo.layout=concatenated"], "plain"),             # plain learner, one row per episode, token TIS
    ("q-tis", ["algo.layout=concatenated", "train.learner_autocast=bf16"], "plain"),  # the learner's settings too
])
def test_profile_equals_the_trainers_logged_metrics(tmp_path, policy_dir, arm, extra, learner):
    """THE equivalence: a train.steps=1 run's metrics.jsonl and the diagnostic on the same policy, tasks and seeds."""
    from interq.train.build import env_factory, split_tasks
    from interq.train.mismatch import mismatch_profile
    from interq.train.policy import load_policy

    cfg = build_config(arm, TOY + STEP + extra)
    recs = run_training(cfg, tmp_path / "run", policy_dir, log=lambda *_: None)
    rec = next(r for r in recs if r["step"] == 1)
    model, tok = load_policy(policy_dir)
    train_tasks, _ = split_tasks(env_factory(cfg.env), cfg.env)
    n = cfg.train.tasks_per_step * cfg.train.episodes_per_task  # one training step's episodes
    prof = mismatch_profile(model, tok, cfg, train_tasks, episodes=n, log=lambda *_: None)
    assert prof["learner"] == learner
    assert set(prof["learners"]) == {"plain", "aligned"}  # w8a8 executor: both learners
    m = prof["learners"][learner]["metrics"]
    # the same episodes: same rows, tokens and outcomes
    assert (prof["rows"], prof["tokens"], prof["context_tokens"]) == (rec["batch/rows"], rec["batch/action_tokens"], rec["batch/tokens"])
    assert prof["rollout"]["rollout/return"] == pytest.approx(rec["rollout/return"], abs=1e-12)
    keys = [k for k in rec if k.startswith(("turn/", "mismatch/", "interq/"))]
    if arm == "q-interq":  # the trainer's own correction is interq: every §7 metric, weights included
        keys += [k for k in rec if k.startswith("weights/")]
        assert {"turn/abs_Lambda/2", "interq/budget_bound_frac", "weights/ess"} <= set(keys)
        assert rec["interq/budget_bound_frac"] > 0  # the budget binds: the comparison is not vacuous
    assert {"turn/abs_delta_mean/3", "turn/abs_prefix_logratio/3", "mismatch/abs_delta_mean", "mismatch/k1"} <= set(keys)
    assert rec["mismatch/abs_delta_mean"] > 0
    for k in keys:
        assert m[k] == pytest.approx(rec[k], rel=1e-6, abs=1e-9), k  # exact here; the tolerance allows BLAS noise
    # the reported lists and scalars are those metrics
    for curve, field in (("abs_delta_mean", "abs_delta_mean_by_turn"), ("abs_prefix_logratio", "abs_prefix_logratio_by_turn")):
        assert prof["learners"][learner][field] == pytest.approx(turn_curve(rec, curve), rel=1e-6, abs=1e-9)
    assert prof["learners"][learner]["abs_delta_mean"] == pytest.approx(rec["mismatch/abs_delta_mean"], rel=1e-6, abs=1e-9)
    assert prof["learners"][learner]["signed_delta_mean"] == pytest.approx(-rec["mismatch/k1"], rel=1e-6, abs=1e-9)
    if arm == "q-interq":
        s = prof
        assert s["abs_lambda_by_turn"] == pytest.approx(turn_curve(rec, "abs_Lambda"), rel=1e-6, abs=1e-9)
        assert s["budget_bound_frac"] == pytest.approx(rec["interq/budget_bound_frac"], abs=1e-12)
        assert s["effective_support_mean"] == pytest.approx(rec["interq/support_mean"], rel=1e-6, abs=1e-9)
        # the per-turn binding shares and supports average back to the batch values
        w = s["turns_by_turn"]
        assert sum(x * c for x, c in zip(s["budget_bound_frac_by_turn"], w)) / sum(w) == pytest.approx(s["budget_bound_frac"])
        assert max(s["abs_lambda_by_turn"]) <= cfg.algo.budget + 1e-12
        assert s["abs_lambda_by_turn"][-1] < s["abs_prefix_logratio_by_turn"][-1]  # the budget truncates


def _naive_profile(prox, beh, mask, budget):
    """Concatenated rows, spec §2-§3 by Python loops: per turn number, the signed token mean of delta, the share of
    turns whose kappa < 1, the mean support of non-empty turns, counts."""
    acc = {}
    for b in range(prox.shape[0]):
        segs, cur = [], []
        for i in range(prox.shape[1]):
            if mask[b, i]:
                cur.append(i)
            elif cur:
                segs.append(cur)
                cur = []
        if cur:
            segs.append(cur)
        hist_a = 0.0
        for t, seg in enumerate(segs, start=1):
            d = [max(-20.0, min(20.0, float(prox[b, i] - beh[b, i]))) for i in seg]
            mx = max(d)
            r = [math.exp(x - mx) for x in d]
            s = sum(r) ** 2 / (len(r) * sum(x * x for x in r))
            kappa = 1.0 if hist_a <= budget else budget / hist_a
            a = acc.setdefault(t, {"D": 0.0, "n": 0, "bound": 0, "s": 0.0, "turns": 0})
            a["D"] += sum(d)
            a["n"] += len(d)
            a["bound"] += kappa < 1
            a["s"] += s
            a["turns"] += 1
            hist_a += s * abs(sum(d))
    return acc


def test_turn_profile_matches_a_naive_loop():
    gen = torch.Generator().manual_seed(3)
    B, L = 5, 24
    beh = -torch.rand(B, L, generator=gen, dtype=torch.float64) * 3
    prox = beh + torch.randn(B, L, generator=gen, dtype=torch.float64) * 0.3
    mask = torch.zeros(B, L, dtype=torch.bool)
    for b in range(B):  # turns of varying length and number per row
        pos = 1 + b % 2
        for n_tok in [3, 1, 4, 2, 5][: 2 + b % 4]:
            mask[b, pos: pos + n_tok] = True
            pos += n_tok + 2
    budget = 0.4
    got = interq_turn_profile(prox, beh, mask, budget)
    ref = _naive_profile(prox, beh, mask, budget)
    assert any(a["bound"] for a in ref.values()) and not all(a["bound"] == a["turns"] for t, a in ref.items() if t > 1)
    for t, a in ref.items():
        assert got[f"turn/signed_delta_mean/{t}"] == pytest.approx(a["D"] / a["n"], rel=1e-12), t
        assert got[f"turn/budget_bound_frac/{t}"] == pytest.approx(a["bound"] / a["turns"], abs=1e-12), t
        assert got[f"turn/support_mean/{t}"] == pytest.approx(a["s"] / a["turns"], rel=1e-10), t
        assert (got[f"turn/turns/{t}"], got[f"turn/action_tokens/{t}"]) == (a["turns"], a["n"]), t
    assert f"turn/turns/{max(ref) + 1}" not in got
    # consistent with compute_correction's batch-level interq/* metrics
    c = compute_correction("interq", prox, beh, mask, config=CorrectionConfig(budget=budget)).metrics
    n_turns = sum(a["turns"] for a in ref.values())
    assert c["interq/budget_bound_frac"] == pytest.approx(sum(a["bound"] for a in ref.values()) / n_turns, abs=1e-12)
    assert c["interq/support_mean"] == pytest.approx(sum(a["s"] for a in ref.values()) / n_turns, rel=1e-10)


def test_cli_end_to_end(tmp_path, capsys):
    out = tmp_path / "mm"
    assert main(["mismatch", "--preset", "q-interq", "--out", str(out), "--episodes", "4", *TOY]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert any(line.startswith("[mismatch] step-1 tasks: 4 episodes") for line in lines)  # progress
    assert lines[-1].startswith("RESULT ")
    res = json.loads(lines[-1][len("RESULT "):])
    for key in ("abs_delta_mean", "signed_delta_mean", "abs_prefix_logratio_by_turn", "abs_lambda_by_turn",
                "budget_bound_frac", "effective_support_mean", "episodes", "tokens", "executor", "learner", "machine"):
        assert key in res, key
    assert res["episodes"] == 4 and res["tokens"] > 0 and res["learner"] == "aligned" and res["budget"] == 0.5
    assert res["turns"] == 3  # the toy environment's episodes last env.max_turns = 3 turns
    for key in ("abs_prefix_logratio_by_turn", "abs_lambda_by_turn", "abs_delta_mean_by_turn", "budget_bound_frac_by_turn",
                "effective_support_by_turn"):
        assert len(res[key]) == res["turns"], key
    assert res["abs_prefix_logratio_by_turn"][0] == 0.0 and res["abs_lambda_by_turn"][0] == 0.0
    e = res["executor"]
    assert (e["executor"], e["w_format"], e["a_format"], e["kv_format"]) == ("w8a8", "int8", "int8", "int8_per_token_head")
    assert (e["w_bits"], e["a_bits"], e["kv_bits"]) == (8, 8, 8)
    assert res["machine"]["threads"] == 1 and res["machine"]["wall_s"] > 0 and res["machine"]["cpu"]
    table = (out / "mismatch.md").read_text()
    assert "### aligned learner" in table and "### plain learner" in table and "| 3 |" in table
    assert (out / "mismatch.png").read_bytes()[:4] == b"\x89PNG"
    saved = json.loads((out / "mismatch.json").read_text())
    assert saved["learners"]["aligned"]["abs_lambda_by_turn"] == pytest.approx(res["abs_lambda_by_turn"], rel=1e-5)


def test_cli_with_a_policy_directory_and_a_bf16_executor(tmp_path, capsys, policy_dir):
    """--policy skips the warm start; 3 episodes (not a multiple of the group size) are played; a bf16 executor
    has no aligned learner; --budget overrides algo.budget."""
    out = tmp_path / "mm"
    assert main(["mismatch", "--preset", "bf16", "--policy", str(policy_dir), "--out", str(out), "--episodes", "3",
                 "--budget", "0.25", *TOY]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1][len("RESULT "):])
    assert res["episodes"] == 3 and res["learner"] == "plain" and set(res["by_learner"]) == {"plain"}
    assert res["budget"] == 0.25 and res["executor"]["executor"] == "bf16"
    assert not (out / "warm_start").exists()


@pytest.mark.parametrize("args, needle", [
    (["--preset", "nope"], "unknown preset 'nope'"),
    (["--preset", "q-interq", "algo.correction=magic"], "algo.correction='magic' is not accepted"),
    (["--preset", "q-interq", "train.steps"], "expected key.sub=value"),
    (["--preset", "q-interq", "--policy", "/nonexistent/policy"], "--policy='/nonexistent/policy'"),
    (["--preset", "q-interq", "--episodes", "0"], "--episodes=0"),
    (["--preset", "q-interq", "--episodes", "-3"], "--episodes=-3"),
    (["--preset", "q-interq", "--budget", "-1"], "--budget=-1"),
    (["--preset", "q-interq", "env.name=toy", "env.env_kwargs={colour: red}"], "env.env_kwargs"),
])
def test_bad_input_rejected_before_any_work(tmp_path, capsys, args, needle):
    out = tmp_path / "x"
    with pytest.raises(SystemExit) as e:
        main(["mismatch", "--out", str(out), *args])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("interq: invalid configuration:") and needle in err, err
    assert not out.exists()  # nothing was built or written


def test_a_warm_start_made_from_other_inputs_is_refused_then_remade_with_fresh(tmp_path, capsys):
    out = tmp_path / "mm"
    assert main(["mismatch", "--preset", "q-interq", "--out", str(out), "--episodes", "2", *TOY]) == 0
    capsys.readouterr()
    other = [*TOY, "warm_start.steps=4"]
    assert main(["mismatch", "--preset", "q-interq", "--out", str(out), "--episodes", "2", *other]) == 2
    assert "warm_start.steps" in capsys.readouterr().err
    assert main(["mismatch", "--preset", "q-interq", "--out", str(out), "--episodes", "2", "--fresh", *other]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("RESULT ")


def test_setting_and_regime_apply_before_the_overrides(tmp_path, capsys, policy_dir, monkeypatch):
    """--setting puts interq compare's built-in overrides first and --regime its executor regime after them; the
    command line's own overrides come last and win."""
    from interq.train import experiments

    monkeypatch.setitem(experiments.SETTINGS, "demo", ["rollout.max_action_tokens=2", "train.seed=5"])
    out = tmp_path / "mm"
    assert main(["mismatch", "--preset", "q-interq", "--policy", str(policy_dir), "--out", str(out), "--episodes", "2",
                 "--setting", "demo", "--regime", "matched", *TOY, "train.seed=7"]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1][len("RESULT "):])
    e = res["executor"]
    assert (e["w_bits"], e["a_bits"], e["kv_bits"]) == (4, 4, 4)  # REGIMES["matched"]
    saved = (out / "config.yaml").read_text()
    assert "max_action_tokens: 3" in saved and "seed: 7" in saved  # TOY and the last override win over the setting
    assert main(["mismatch", "--preset", "q-interq", "--policy", str(policy_dir), "--out", str(tmp_path / "m2"),
                 "--episodes", "2", "--setting", "demo", *(t for t in TOY if "max_action_tokens" not in t)]) == 0
    assert "max_action_tokens: 2" in (tmp_path / "m2" / "config.yaml").read_text()  # without TOY's: the setting's
