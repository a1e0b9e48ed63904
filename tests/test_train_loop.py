"""The RL loop on the toy environment: gradient accumulation, learner forward counts, resume, every method."""

import copy
import json

import pytest
import torch

from interq.train.config import build_config
from interq.train.pipeline import run_training
from train_helpers import rollout_episodes, warm_start, without_timings

TOY = ["env.name=toy", "env.max_turns=4", "env.num_train_tasks=16", "env.num_eval_tasks=4", "env.env_kwargs={length: 2}",
       "model.vocab_size=300", "model.hidden_size=32", "model.intermediate_size=64", "model.num_heads=2",
       "model.num_kv_heads=1", "warm_start.num_demos=16", "warm_start.steps=6", "warm_start.episodes_per_microbatch=8",
       "train.tasks_per_step=2", "train.episodes_per_task=2", "train.progress=false", "rollout.max_action_tokens=4"]


# Parameters after one Adam step by two routes that sum the same fp32 terms in another order: Adam divides each
# gradient by sqrt(v) + eps, so a gradient near eps turns a rounding-level difference into up to ~1e-5 of the lr
# (optim.lr 1e-3: seen 1.7e-6 and 2.8e-6 on 1 of 1-2k elements on an Intel Xeon, whose MKL GEMMs round differently
# by shape). A real difference (a micro-batch weighted wrongly, a pass that changes the loss) moves most elements by
# O(lr); the losses are compared to 1e-5 relative besides.
PARAM_ATOL = 1e-5


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory):
    return warm_start(tmp_path_factory, "bf16", TOY)


def _setup(arm, policy_dir, extra=()):
    from interq.train import rl

    cfg = build_config(arm, TOY + list(extra))
    model, ex, fmt, eps = rollout_episodes(policy_dir, cfg, lambda train_tasks: rl.step_tasks(train_tasks, cfg, 1))
    batch = rl.build_batch(eps, cfg.algo, fmt.pad_token_id)
    # fixed non-zero advantages: a barely trained policy often fails every episode of a group (all A = 0)
    gen = torch.Generator().manual_seed(0)
    batch.advantages = torch.randn(batch.advantages.shape, generator=gen) * batch.action_mask
    return cfg, model, ex, batch


def _update(cfg, model, ex, batch, overrides=()):
    from interq.train import rl
    from interq.train.config import with_overrides

    cfg = with_overrides(cfg, list(overrides))
    m = copy.deepcopy(model)
    learner = rl.Learner(m, cfg, ex.qcfg)
    rec = rl.update(learner, batch, cfg, step=1)
    return m, rec


CONCAT = ["algo.layout=concatenated", "algo.loss_agg=token_mean", "algo.grpo_std=true"]  # the presets use per_turn


@pytest.mark.parametrize("arm, extra", [
    ("bf16", CONCAT),                                       # proximal pass skipped
    ("bf16", [*CONCAT, "algo.correction=icepop"]),          # keep-mask depends on proximal: pass runs
    ("q-interq", CONCAT),
    ("q-interq", ["algo.loss_agg=seq_mean_token_mean"]),    # the preset: per_turn rows, trajectory = sequence
    ("q-interq", ["algo.layout=per_turn", "rollout.history_turns=1", "algo.advantage=gigpo"]),
    ("q-interq", ["algo.layout=per_turn", "rollout.history_turns=1", "algo.loss_agg=seq_mean_token_mean"]),
])
def test_gradient_accumulation_2x2_equals_1x4(policy_dir, arm, extra):
    cfg, model, ex, batch = _setup(arm, policy_dir, extra)
    assert len(set(batch.row_episode)) == 4
    rows, width = batch.input_ids.shape
    budget = rows * width // 2  # the 4 episodes no longer fit in one micro-batch (2 x 2 for concatenated rows)
    # fp32 gradients: bf16_backward (the default where bf16 is native) rounds each micro-batch's weight gradient to
    # bf16 before the accumulation adds them, so 2 x 2 and 1 x 4 agree to bf16 there, not to the 1e-5 below
    fp32 = "train.learner_autocast=off"
    m1, r1 = _update(cfg, model, ex, batch, ["train.tokens_per_microbatch=100000", fp32])
    m2, r2 = _update(cfg, model, ex, batch, [f"train.tokens_per_microbatch={budget}", fp32])
    assert r1["learner/microbatches"] == 1 and r2["learner/microbatches"] >= 2
    changed = False
    for p, q, p0 in zip(m1.parameters(), m2.parameters(), model.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=PARAM_ATOL)
        changed |= not torch.equal(p, p0)
    assert changed, "the update did not move the weights: the test would pass vacuously"
    assert r1["loss/policy"] == pytest.approx(r2["loss/policy"], rel=1e-5, abs=1e-7)


@pytest.mark.parametrize("extra, passes", [([], 1.0), (["algo.ppo_epochs=2"], 3.0), (["algo.minibatches_per_step=2"], 2.0)])
def test_interq_adds_no_learner_forward_over_tis(policy_dir, extra, passes):
    cfg, model, ex, batch = _setup("q-tis", policy_dir)
    _, r_tis = _update(cfg, model, ex, batch, extra)
    _, r_iq = _update(cfg, model, ex, batch, ["algo.correction=interq", *extra])
    assert r_iq["learner/forward_calls"] == r_tis["learner/forward_calls"]
    assert r_iq["learner/forward_passes"] == r_tis["learner/forward_passes"] == passes
    assert r_tis["learner/proximal_pass_skipped"] is (passes == 1.0)


@pytest.mark.parametrize("method", ["none", "tis", "icepop", "seq_is", "geo_mask", "prefix_is", "interq", "interq_uniform"])
def test_every_correction_method_runs_in_the_loop(policy_dir, method):
    cfg, model, ex, batch = _setup("q-tis", policy_dir)
    m, rec = _update(cfg, model, ex, batch, [f"algo.correction={method}"])
    assert all(torch.isfinite(p).all() for p in m.parameters())
    for key in ("mismatch/k3", "weights/ess", "weights/keep_frac", "turn/abs_prefix_logratio/1"):
        assert key in rec, key


def test_resumed_run_matches_uninterrupted(policy_dir, tmp_path):
    common = ["train.checkpoint_every_steps=2", "train.eval_every_steps=2"]
    full = run_training(build_config("q-interq", TOY + common + ["train.steps=4"]), tmp_path / "a", policy_dir)
    run_training(build_config("q-interq", TOY + common + ["train.steps=2"]), tmp_path / "b", policy_dir)
    # the "crash": steps 3-4 never ran; a restart with the full config resumes from step 2
    resumed = run_training(build_config("q-interq", TOY + common + ["train.steps=4"]), tmp_path / "b", policy_dir)
    assert [r["step"] for r in resumed] == [0, 1, 2, 3, 4]
    assert [without_timings(r) for r in resumed] == [without_timings(r) for r in full]
    saved = json.loads((tmp_path / "b" / "checkpoints" / "step_000004" / "state.json").read_text())
    assert saved["step"] == 4


@pytest.mark.parametrize("arm, extra", [
    ("bf16", CONCAT),
    ("q-interq", CONCAT),
    ("q-interq", [*CONCAT, "train.learner_autocast=bf16_backward"]),
    ("q-interq", ["algo.layout=per_turn", "rollout.history_turns=1"]),
    ("q-tis", ["algo.ppo_epochs=2", "algo.minibatches_per_step=2"]),
])
def test_update_raises_the_advantage_weighted_logprob(policy_dir, arm, extra):
    """The direction of the whole update: after one RL step, sum_tokens A * log pi(action) must go up (a flipped
    sign anywhere between the advantages and the optimizer step makes it go down)."""
    from interq.train import rl

    cfg, model, ex, batch = _setup(arm, policy_dir, extra)
    sign = torch.tensor([1.0 if batch.row_episode[b] % 2 else -1.0 for b in range(batch.input_ids.shape[0])])  # [B]
    batch.advantages = sign[:, None] * batch.action_mask  # +1 on odd episodes' actions, -1 on even ones'

    def objective(m):
        learner = rl.Learner(m, cfg, ex.qcfg)
        with torch.no_grad():
            mb = rl._rows(batch, list(range(batch.input_ids.shape[0])))
            lp = learner.logprobs(mb, batch)  # [B, l]
        return float((mb["advantages"] * lp.nan_to_num(0.0)).sum())

    before = objective(copy.deepcopy(model))
    m, _ = _update(cfg, model, ex, batch, ["optim.lr=1e-3"])
    after = objective(m)
    assert after > before + 1e-3, (before, after)


@pytest.mark.parametrize("where", ["behavior", "loss", "gradient"])
def test_nonfinite_updates_are_skipped_and_counted(policy_dir, where, monkeypatch):
    """NaN in behaviour log-probs, in the loss or in one gradient: the weights never become NaN; a skipped optimizer
    step is counted (optim/nonfinite_steps); NaN behaviour log-probs only drop those tokens."""
    from interq.algo import loss as loss_mod
    from interq.train import rl

    cfg, model, ex, batch = _setup("q-interq", policy_dir, ["algo.layout=per_turn", "rollout.history_turns=1"])
    if where == "behavior":
        batch.behavior_logprobs = batch.behavior_logprobs.clone()
        batch.behavior_logprobs[0][batch.action_mask[0]] = float("nan")
    elif where == "loss":
        orig = loss_mod.ppo_loss
        monkeypatch.setattr(loss_mod, "ppo_loss", lambda *a, **k: (lambda out: (out[0] * float("nan"), out[1]))(orig(*a, **k)))
    else:
        orig_init = rl.Learner.__init__

        def init(self, m, *a, **k):
            orig_init(self, m, *a, **k)
            next(m.parameters()).register_hook(lambda g: g * float("inf"))

        monkeypatch.setattr(rl.Learner, "__init__", init)
    before = [p.detach().clone() for p in model.parameters()]
    m, rec = _update(cfg, model, ex, batch)
    assert all(torch.isfinite(p).all() for p in m.parameters())
    if where == "behavior":
        assert rec["optim/nonfinite_steps"] == 0 and rec["optim/steps"] == 1
        assert any(not torch.equal(a, b) for a, b in zip(before, m.parameters()))
    else:
        assert rec["optim/nonfinite_steps"] == 1 and rec["optim/steps"] == 0
        assert all(torch.equal(a, b) for a, b in zip(before, m.parameters()))  # the step was skipped


def test_run_stops_cleanly_after_repeated_nonfinite_steps(policy_dir, tmp_path, monkeypatch, capsys):
    """A finite loss whose gradient is not (an overflow in the backward) skips the update; this many steps in a row
    stop the run (a non-finite loss stops it at once: tests/test_faults.py)."""
    from interq.cli import main
    from interq.train import rl

    orig_init = rl.Learner.__init__

    def init(self, m, *a, **k):
        orig_init(self, m, *a, **k)
        next(m.parameters()).register_hook(lambda g: g * float("inf"))

    monkeypatch.setattr(rl.Learner, "__init__", init)
    code = main(["train", "--preset", "q-interq", "--policy", str(policy_dir), "--out", str(tmp_path / "run"), *TOY,
                 "train.steps=5", "optim.max_nonfinite_steps=2", "train.eval_every_steps=0", "train.checkpoint_every_steps=1"])
    assert code == 3
    err = capsys.readouterr().err
    assert "2 steps in a row" in err and "max_nonfinite_steps" in err
    recs = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs] == [1, 2] and all(r["optim/nonfinite_steps"] == 1 for r in recs)


def _poison(monkeypatch, batch, which):
    """The learner's log-prob of the first action token of the rows ``which`` becomes -inf (as top_p < 1 does when
    the learner's nucleus leaves out the sampled token), in every learner forward."""
    from interq.train import rl

    first = batch.action_mask.float().argmax(-1)  # [B]
    real = rl._sequence_logprobs  # under every learner forward (proximal pass and training forward)

    def poisoned(model, mb, b):
        out = real(model, mb, b)
        hit = torch.zeros(out.shape, dtype=torch.bool)
        for j, r in enumerate(mb["idx"].tolist()):
            if r in which:
                hit[j, first[r]] = True
        return torch.where(hit, float("-inf"), out)

    monkeypatch.setattr(rl, "_sequence_logprobs", poisoned)


@pytest.mark.parametrize("arm, extra", [("q-tis", CONCAT), ("q-interq", []), ("q-interq", ["algo.loss_agg=token_mean"])])
def test_skipped_proximal_pass_equals_the_pass(policy_dir, arm, extra, monkeypatch):
    """Skipping the proximal pass (1 epoch, 1 mini-batch) is the same update as running it, also when a learner
    log-prob is not finite: the loss stays a mean over the tokens (sequences) actually kept."""
    from interq.train import rl

    # fp32 gradients (see test_gradient_accumulation_2x2_equals_1x4): with non-finite log-probs the two paths' loss
    # gradients differ by fp32 rounding, which bf16_backward's bf16 roundings of them turn into 0.5% differences
    cfg, model, ex, batch = _setup(arm, policy_dir, [*extra, "train.learner_autocast=off"])
    m1, r1 = _update(cfg, model, ex, batch)
    assert r1["learner/proximal_pass_skipped"] is True
    with monkeypatch.context() as mp:
        mp.setattr(rl, "skips_proximal_pass", lambda a: False)
        m2, r2 = _update(cfg, model, ex, batch)
    assert r2["learner/proximal_pass_skipped"] is False
    assert r1["loss/policy"] == pytest.approx(r2["loss/policy"], rel=1e-5, abs=1e-7)
    for p, q in zip(m1.parameters(), m2.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=PARAM_ATOL)
    # now with non-finite learner log-probs on two rows
    _poison(monkeypatch, batch, {0, 1})
    m3, r3 = _update(cfg, model, ex, batch)
    monkeypatch.setattr(rl, "skips_proximal_pass", lambda a: False)
    m4, r4 = _update(cfg, model, ex, batch)
    assert r3["optim/steps"] == r4["optim/steps"] == 1 and r3["weights/keep_frac"] < 1.0
    assert r3["loss/policy"] == pytest.approx(r4["loss/policy"], rel=1e-5, abs=1e-7)
    for p, q in zip(m3.parameters(), m4.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=PARAM_ATOL)


@pytest.mark.parametrize("arm, extra", [("q-tis", CONCAT), ("q-interq", ["algo.budget=inf"]), ("q-interq", ["algo.budget=inf", "algo.ppo_epochs=2"]),
                                        ("q-interq", ["algo.budget=inf", "algo.token_correction=false"])])
def test_weights_reaching_the_loss(policy_dir, arm, extra, monkeypatch):
    """What the trainer hands ppo_loss: behavior = learner - 0.3 on every action token, so delta = +0.3 and the token
    weight is min(exp(0.3), C) times exp(Lambda), Lambda = 0.3 x (earlier action tokens of the trajectory) with no
    budget; a swapped argument (exp(-0.3)) or a history including the current turn fails."""
    from interq.algo import loss as loss_mod
    from interq.train import rl

    cfg, model, ex, batch = _setup(arm, policy_dir, extra)
    learner = rl.Learner(copy.deepcopy(model), cfg, ex.qcfg)
    with torch.no_grad():
        lp = learner.logprobs(rl._rows(batch, list(range(batch.input_ids.shape[0]))), batch)
    batch.behavior_logprobs = torch.where(batch.action_mask, lp - 0.3, batch.behavior_logprobs)
    seen = []
    real = loss_mod.ppo_loss

    def spy(current, proximal, adv, weights, keep, **kw):
        seen.append((weights.detach().clone(), keep.clone()))
        return real(current, proximal, adv, weights, keep, **kw)

    monkeypatch.setattr(loss_mod, "ppo_loss", spy)
    _update(cfg, model, ex, batch)
    assert seen
    tis = min(torch.exp(torch.tensor(0.3)).item(), cfg.algo.tis_cap) if cfg.algo.token_correction else 1.0
    for w, k in seen:
        kept = w[k]
        if cfg.algo.correction == "tis":
            torch.testing.assert_close(kept, torch.full_like(kept, tis), rtol=1e-4, atol=1e-5)
        else:  # interq without budget: the whole history's delta, each earlier token 0.3 (s = 1: equal deltas)
            assert kept.min() == pytest.approx(tis, rel=1e-4)  # a first turn: no history
            assert kept.max() > tis * 1.3  # later turns carry exp(0.3 x earlier action tokens)
            ratio = torch.log(kept / tis) / 0.3  # = number of earlier action tokens: an integer
            torch.testing.assert_close(ratio, ratio.round(), rtol=0, atol=1e-3)
