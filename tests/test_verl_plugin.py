"""The InterQ verl plugin against the real verl package (CPU; ``import verl`` once per module).

Batches are laid out as verl's agent loop lays them out (``AgentLoopWorker._agent_loop_postprocess`` /
``_postprocess``: left-padded prompts, right-padded responses, ``response_mask`` 1 on assistant tokens,
``rollout_log_probs`` 0.0 off the mask) in a real ``verl.DataProto``; the agent-loop module itself is not
imported (it needs cachetools/fastapi/uvicorn, which the ``verl`` extra does not pull in).
"""

from __future__ import annotations

import copy
import functools
import logging
import os

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.verl

PLUGIN = "interq.integrations.verl.plugin"


class _ListHandler(logging.Handler):
    def __init__(self):
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)


@pytest.fixture(scope="module")
def V():
    """verl imported once, with the plugin loaded the way verl loads it (EntryPoint.load())."""
    pytest.importorskip("verl")
    import importlib.metadata as md
    import sys

    handler = _ListHandler()
    logging.getLogger("interq.integrations.verl").addHandler(handler)
    fresh = PLUGIN not in sys.modules
    ep = md.EntryPoint(name="interq", value=PLUGIN, group="verl.plugins")
    ep.load()
    ep.load()  # loaded twice: nothing twice
    import verl
    from verl import DataProto
    from verl.trainer.ppo import rollout_corr_helper as helper

    from interq.integrations.verl import plugin

    ns = type("V", (), {})()
    ns.verl, ns.DataProto, ns.helper, ns.plugin = verl, DataProto, helper, plugin
    ns.load_records = [r for r in handler.records if "plugin loaded" in r.getMessage()] if fresh else None
    logging.getLogger("interq.integrations.verl").removeHandler(handler)
    return ns


# ---------------------------------------------------------------------------------------------------
# Episodes and the two verl layouts


def make_episodes(n_traj=5, max_turns=4, seed=0, drift=0.15):
    """Multi-turn episodes: per turn an observation (tool/user text) and an action (assistant tokens)."""
    g = torch.Generator().manual_seed(seed)
    eps = []
    for i in range(n_traj):
        T = int(torch.randint(1, max_turns + 1, (1,), generator=g))
        turns = []
        for _ in range(T):
            n_obs = int(torch.randint(1, 4, (1,), generator=g))
            n_act = int(torch.randint(1, 5, (1,), generator=g))
            behavior = -torch.rand(n_act, generator=g, dtype=torch.float64) * 3  # log mu
            shift = drift * torch.randn(1, generator=g, dtype=torch.float64)  # systematic per turn
            proximal = behavior + shift + 0.1 * torch.randn(n_act, generator=g, dtype=torch.float64)
            turns.append(dict(
                obs=torch.randint(3, 90, (n_obs,), generator=g).tolist(),
                act=torch.randint(3, 90, (n_act,), generator=g).tolist(),
                behavior=behavior.float().tolist(), proximal=proximal.float().tolist(),
            ))
        eps.append(dict(prompt=torch.randint(3, 90, (3,), generator=g).tolist(), turns=turns, uid=f"traj-{i}"))
    return eps


def _pad_batch(V, rows, prompt_length, response_length, non_tensor=None):
    """rows: dicts prompt, response, mask, behavior, proximal (lists). verl's agent-loop padding."""
    from tensordict import TensorDict

    B = len(rows)
    prompts = torch.zeros(B, prompt_length, dtype=torch.long)
    responses = torch.zeros(B, response_length, dtype=torch.long)
    p_attn = torch.zeros(B, prompt_length, dtype=torch.long)
    r_attn = torch.zeros(B, response_length, dtype=torch.long)
    mask_ids = torch.zeros(B, response_length, dtype=torch.long)
    rollout_lp = torch.zeros(B, response_length)
    old_lp = torch.zeros(B, response_length)
    g = torch.Generator().manual_seed(123)
    for i, r in enumerate(rows):
        P, R = len(r["prompt"]), len(r["response"])
        assert P <= prompt_length and R <= response_length
        prompts[i, prompt_length - P:] = torch.tensor(r["prompt"])  # left padded
        p_attn[i, prompt_length - P:] = 1
        responses[i, :R] = torch.tensor(r["response"])  # right padded
        r_attn[i, :R] = 1
        mask_ids[i, :R] = torch.tensor(r["mask"])
        # agent loop: response_logprobs + [0.0] * pad, 0.0 on tool tokens (never sampled by the engine)
        rollout_lp[i, :R] = torch.tensor(r["behavior"])
        # the actor's old_log_probs pass covers every response token (tool tokens get some value too)
        old_lp[i, :R] = torch.where(torch.tensor(r["mask"]).bool(), torch.tensor(r["proximal"]),
                                    -5 * torch.rand(R, generator=g))
    response_mask = mask_ids * r_attn
    attention_mask = torch.cat([p_attn, r_attn], 1)
    input_ids = torch.cat([prompts, responses], 1)
    position_ids = (attention_mask.cumsum(1) - 1).clamp(min=0) * attention_mask
    td = TensorDict({
        "prompts": prompts, "responses": responses, "response_mask": response_mask, "input_ids": input_ids,
        "attention_mask": attention_mask, "position_ids": position_ids, "rollout_log_probs": rollout_lp,
        "old_log_probs": old_lp,
    }, batch_size=B)
    nt = {"__num_turns__": np.array([2] * B, dtype=np.int32)}
    nt.update(non_tensor or {})
    return V.DataProto(batch=td, non_tensor_batch=nt, meta_info={})


def trajectory_batch(V, eps, response_length=40):
    """One row per trajectory: response = a_1 o_2 a_2 ... (verl's multi-turn agent loop)."""
    rows = []
    for e in eps:
        resp, mask, beh, prox = [], [], [], []
        for t, tr in enumerate(e["turns"]):
            if t > 0:
                resp += tr["obs"]; mask += [0] * len(tr["obs"]); beh += [0.0] * len(tr["obs"]); prox += [0.0] * len(tr["obs"])
            resp += tr["act"]; mask += [1] * len(tr["act"]); beh += tr["behavior"]; prox += tr["proximal"]
        rows.append(dict(prompt=e["prompt"] + e["turns"][0]["obs"], response=resp, mask=mask, behavior=beh, proximal=prox))
    return _pad_batch(V, rows, 8, response_length)


def step_rows(eps):
    """One row per (trajectory, step): prompt = history, response = that step's action (verl-agent)."""
    rows = []
    for e in eps:
        hist = list(e["prompt"])
        for t, tr in enumerate(e["turns"]):
            hist = hist + tr["obs"]
            rows.append(dict(prompt=hist[-8:], response=tr["act"], mask=[1] * len(tr["act"]), behavior=tr["behavior"],
                             proximal=tr["proximal"], traj=e["uid"], step=t))
            hist = hist + tr["act"]
    return rows


def step_batch(V, rows, step_as_tensor=False):
    nt = {"traj_uid": np.array([r["traj"] for r in rows], dtype=object)}
    b = _pad_batch(V, rows, 8, 6, non_tensor=nt)
    steps = np.array([r["step"] for r in rows], dtype=np.int64)
    if step_as_tensor:
        b.batch["step_idx"] = torch.as_tensor(steps)
    else:
        b.non_tensor_batch["step_idx"] = steps
    return b


def rc_config(rollout_is="interq", **interq):
    """verl's own rollout_correction defaults (its yaml) + the plugin's options, as hydra would build them."""
    from omegaconf import OmegaConf, open_dict

    import verl

    cfg = OmegaConf.load(os.path.join(os.path.dirname(verl.__file__), "trainer/config/algorithm/rollout_correction.yaml"))
    OmegaConf.set_struct(cfg, True)
    cfg.rollout_is = rollout_is
    if interq:
        with open_dict(cfg):  # what `+algorithm.rollout_correction.interq.x=...` does
            cfg.interq = interq
    return cfg


def clone(b):
    return copy.deepcopy(b)


# ---------------------------------------------------------------------------------------------------
# Loading


def test_plugin_loads_wraps_once_and_logs_once(V):
    fn = V.helper.compute_rollout_correction_and_add_to_batch
    original = fn.__interq_original__
    assert getattr(original, "__interq_original__", None) is None, "wrapped twice"
    assert original.__module__ == "verl.trainer.ppo.rollout_corr_helper"
    assert V.helper.apply_bypass_mode.__interq_original__.__module__ == "verl.trainer.ppo.rollout_corr_helper"
    import verl.utils.config as vc

    assert getattr(vc.validate_config.__interq_original__, "__interq_original__", None) is None
    V.plugin.install()
    import interq.integrations.verl as iv

    iv.install()
    assert V.helper.compute_rollout_correction_and_add_to_batch is fn
    if V.load_records is not None:
        assert len(V.load_records) == 1, [r.getMessage() for r in V.load_records]


# ---------------------------------------------------------------------------------------------------
# Weights = compute_correction on verl's batch


@pytest.mark.parametrize("method", ["interq", "interq_uniform", "prefix_is"])
def test_weights_equal_compute_correction(V, method):
    from interq.algo.corrections import CorrectionConfig, compute_correction

    eps = make_episodes(seed=1)
    batch = trajectory_batch(V, eps)
    expected = compute_correction(
        method, batch.batch["old_log_probs"], batch.batch["rollout_log_probs"], batch.batch["response_mask"].bool(),
        config=CorrectionConfig(budget=0.3, tis_cap=1.5),
    )
    out, metrics = V.helper.compute_rollout_correction_and_add_to_batch(
        clone(batch), rc_config(method, budget=0.3, tis_cap=1.5))
    assert torch.equal(out.batch["rollout_is_weights"], expected.weights)
    assert torch.equal(out.batch["response_mask"], expected.keep_mask.long())
    assert out.batch["response_mask"].dtype == batch.batch["response_mask"].dtype
    # turns really are the runs of 1 in response_mask: the later turns carry a prefix weight
    assert (expected.lambda_[expected.keep_mask] != 0).any()
    # verl's own off-policy metrics are still there, next to spec §7's under rollout_corr/
    for k in ("kl", "k3_kl", "chi2_token", "training_ppl"):
        assert f"rollout_corr/{k}" in metrics
    for k in ("mismatch/k1", "mismatch/k3", "mismatch/chi2_token", "mismatch/abs_delta_mean", "mismatch/nonfinite_frac",
              "weights/mean", "weights/std", "weights/min", "weights/max", "weights/ess", "weights/keep_frac",
              "turn/abs_delta_mean/1", "turn/abs_prefix_logratio/2"):
        assert metrics[f"rollout_corr/{k}"] == pytest.approx(expected.metrics[k]), k
    if method != "prefix_is":
        for k in ("interq/budget_bound_frac", "interq/lambda_abs_mean", "interq/support_mean", "turn/abs_Lambda/2"):
            assert f"rollout_corr/{k}" in metrics
    assert metrics["rollout_corr/mismatch/k1"] == pytest.approx(
        float(-(batch.batch["old_log_probs"] - batch.batch["rollout_log_probs"])[batch.batch["response_mask"].bool()].double().mean()))
    assert all(isinstance(v, float) for v in metrics.values())


def test_interq_budget_bounds_prefix_on_verl_batch(V):
    """Spec §3 property 1 through the hook: |Lambda| <= B, and the raw prefix exceeds B somewhere."""
    eps = make_episodes(n_traj=8, max_turns=6, seed=2, drift=0.6)
    out, m = V.helper.compute_rollout_correction_and_add_to_batch(
        trajectory_batch(V, eps, 60), rc_config("interq", budget=0.25, token_correction=False))
    w = out.batch["rollout_is_weights"][out.batch["response_mask"].bool()]
    assert float(w.log().abs().max()) <= 0.25 + 1e-6
    assert m["rollout_corr/interq/budget_bound_frac"] > 0
    raw = [v for k, v in m.items() if k.startswith("rollout_corr/turn/abs_prefix_logratio/")]
    assert max(raw) > 0.25


# ---------------------------------------------------------------------------------------------------
# verl's worker loss consumes the weights


def _actor_config(V):
    from omegaconf import OmegaConf

    from verl.utils.config import omega_conf_to_dataclass

    full = OmegaConf.load(os.path.join(os.path.dirname(V.verl.__file__), "trainer/config/_generated_ppo_trainer.yaml"))
    full.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu = 2
    return omega_conf_to_dataclass(full.actor_rollout_ref.actor)


def test_verl_ppo_loss_consumes_interq_weights(V):
    from verl.trainer.ppo.core_algos import compute_policy_loss_vanilla
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.losses import ppo_loss

    from interq.algo.loss import ppo_loss as interq_ppo_loss

    eps = make_episodes(seed=3)
    batch, _ = V.helper.compute_rollout_correction_and_add_to_batch(
        trajectory_batch(V, eps), rc_config("interq", budget=0.4))
    td = batch.batch
    B, R = td["responses"].shape
    g = torch.Generator().manual_seed(7)
    old = td["old_log_probs"]
    current = (old + 0.3 * torch.randn(B, R, generator=g)).requires_grad_(True)  # [B, R], |log ratio| small
    adv = torch.randn(B, 1, generator=g).expand(B, R) * td["response_mask"]
    # model output in verl's no-padding layout: per sequence [prompt..., response...], log-prob of token j+1 at j
    attn = td["attention_mask"]
    P = td["prompts"].shape[1]
    pieces = []
    for i in range(B):
        p_len, r_len = int(attn[i, :P].sum()), int(attn[i, P:].sum())
        pieces += [torch.randn(p_len - 1, generator=g), current[i, :r_len], torch.randn(1, generator=g)]
    flat = torch.cat(pieces)  # [total_nnz]
    data = td.select("prompts", "responses", "attention_mask", "response_mask", "old_log_probs", "rollout_is_weights").clone()
    data["advantages"] = adv
    tu.assign_non_tensor_data(data, "dp_size", 1)
    tu.assign_non_tensor_data(data, "batch_num_tokens", None)
    tu.assign_non_tensor_data(data, "global_batch_size", None)
    cfg = _actor_config(V)
    loss, _ = ppo_loss(cfg, {"log_probs": flat}, data)
    (g_verl,) = torch.autograd.grad(loss, current)

    keep = td["response_mask"].bool()
    w = td["rollout_is_weights"]
    vanilla, _ = compute_policy_loss_vanilla(old, current, adv, keep, "token-mean", cfg, rollout_is_weights=w)
    torch.testing.assert_close(loss, vanilla, rtol=1e-6, atol=1e-7)
    # by hand: token-mean over kept tokens of w * clipped PPO (dual clip inactive: ratio < 3)
    ratio = torch.exp(current - old)
    assert float(ratio.detach()[keep].max()) < 3.0
    clipped = torch.maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1.2))
    hand = (clipped * w * keep).sum() / keep.sum()
    torch.testing.assert_close(loss, hand, rtol=1e-6, atol=1e-7)
    # and interq's own decoupled PPO loss with the same weights and keep-mask, gradient included
    ours, _ = interq_ppo_loss(current, old, adv, w, keep, eps_low=0.2, eps_high=0.2)
    torch.testing.assert_close(loss, ours, rtol=1e-5, atol=1e-6)
    (g_ours,) = torch.autograd.grad(ours, current)
    torch.testing.assert_close(g_verl, g_ours, rtol=1e-5, atol=1e-7)
    # the weights matter: without them verl's loss differs
    plain, _ = compute_policy_loss_vanilla(old, current, adv, keep, "token-mean", cfg, rollout_is_weights=None)
    assert abs(float(plain.detach()) - float(loss.detach())) > 1e-4


# ---------------------------------------------------------------------------------------------------
# verl's own levels are untouched


@pytest.mark.parametrize("settings", [
    dict(rollout_is=None),
    dict(rollout_is="token"),
    dict(rollout_is="sequence", rollout_is_threshold=3.0),
    dict(rollout_is="token", rollout_is_threshold="0.5_2.0"),
    dict(rollout_is="token", rollout_rs="token_k1", rollout_rs_threshold="0.7_1.3"),
    dict(rollout_is=None, rollout_rs="seq_mean_k3", rollout_rs_threshold=0.01),
])
def test_builtin_levels_unchanged(V, settings):
    from verl.trainer.config.algorithm import RolloutCorrectionConfig

    batch = trajectory_batch(V, make_episodes(seed=4, drift=0.4))
    original = V.helper.compute_rollout_correction_and_add_to_batch.__interq_original__
    for cfg in (RolloutCorrectionConfig(**settings), rc_config(**settings)):
        a, ma = V.helper.compute_rollout_correction_and_add_to_batch(clone(batch), cfg)
        b, mb = original(clone(batch), cfg)
        assert set(a.batch.keys()) == set(b.batch.keys())
        for k in b.batch.keys():
            assert torch.equal(a.batch[k], b.batch[k]), k
        assert ma == mb


def test_rejection_sampling_composes_with_interq(V):
    """verl's rollout_rs still runs (its own code) and its rejections AND into InterQ's keep-mask."""
    from interq.algo.corrections import compute_correction

    batch = trajectory_batch(V, make_episodes(seed=5, drift=0.4))
    cfg = rc_config("interq")
    with __import__("omegaconf").open_dict(cfg):
        cfg.rollout_rs, cfg.rollout_rs_threshold = "token_k1", "0.8_1.25"
    original = V.helper.compute_rollout_correction_and_add_to_batch.__interq_original__
    rs_only, rs_metrics = original(clone(batch), {"rollout_is": None, "rollout_rs": "token_k1", "rollout_rs_threshold": "0.8_1.25"})
    out, m = V.helper.compute_rollout_correction_and_add_to_batch(clone(batch), cfg)
    expected = compute_correction("interq", batch.batch["old_log_probs"], batch.batch["rollout_log_probs"],
                                  batch.batch["response_mask"].bool())
    keep = expected.keep_mask & rs_only.batch["response_mask"].bool()
    assert 0 < int(keep.sum()) < int(expected.keep_mask.sum())
    assert torch.equal(out.batch["response_mask"].bool(), keep)
    assert torch.equal(out.batch["rollout_is_weights"], torch.where(keep, expected.weights, torch.zeros(())))
    for k, v in rs_metrics.items():
        assert m[k] == pytest.approx(v), k
    assert m["rollout_corr/interq/rejected_frac"] > 0


# ---------------------------------------------------------------------------------------------------
# Layouts: one row per step == one row per trajectory, any order, duplicated rows


def _tokens_by_step(batch, rows):
    """{(traj, step, j): weight} from a per-step batch."""
    w, keep = batch.batch["rollout_is_weights"], batch.batch["response_mask"].bool()
    out = {}
    for i, r in enumerate(rows):
        for j in range(len(r["response"])):
            out[(r["traj"], r["step"], j)] = (float(w[i, j]), bool(keep[i, j]))
    return out


def _tokens_by_traj(batch, eps):
    w, keep = batch.batch["rollout_is_weights"], batch.batch["response_mask"].bool()
    out = {}
    for i, e in enumerate(eps):
        pos = 0
        for t, tr in enumerate(e["turns"]):
            if t > 0:
                pos += len(tr["obs"])
            for j in range(len(tr["act"])):
                out[(e["uid"], t, j)] = (float(w[i, pos]), bool(keep[i, pos]))
                pos += 1
    return out


@pytest.mark.parametrize("method", ["interq", "interq_uniform", "prefix_is"])
def test_step_layout_equals_trajectory_layout_any_order_with_duplicates(V, method):
    eps = make_episodes(n_traj=6, max_turns=5, seed=6, drift=0.5)
    cfg = rc_config(method, budget=0.3)
    traj_out, traj_m = V.helper.compute_rollout_correction_and_add_to_batch(trajectory_batch(V, eps, 60), cfg)
    ref = _tokens_by_traj(traj_out, eps)

    rows = step_rows(eps)
    perm = np.random.default_rng(0).permutation(len(rows))
    shuffled = [rows[i] for i in perm] + [rows[i] for i in perm[:4]]  # reordered + 4 duplicated rows
    for step_as_tensor in (False, True):
        out, m = V.helper.compute_rollout_correction_and_add_to_batch(step_batch(V, shuffled, step_as_tensor), cfg)
        got = _tokens_by_step(out, shuffled)
        assert got.keys() == ref.keys()
        for k in ref:
            assert got[k][1] == ref[k][1], k
            assert got[k][0] == pytest.approx(ref[k][0], rel=1e-5, abs=1e-6), k
        for k in ("turn/abs_prefix_logratio/3", "interq/budget_bound_frac", "interq/lambda_abs_mean"):
            if f"rollout_corr/{k}" in traj_m:
                assert m[f"rollout_corr/{k}"] == pytest.approx(traj_m[f"rollout_corr/{k}"], rel=1e-5, abs=1e-7), k


def test_trajectory_layout_row_order_invariant(V):
    eps = make_episodes(n_traj=6, seed=7)
    cfg = rc_config("interq")
    a, _ = V.helper.compute_rollout_correction_and_add_to_batch(trajectory_batch(V, eps), cfg)
    perm = [3, 0, 5, 1, 4, 2]
    b, _ = V.helper.compute_rollout_correction_and_add_to_batch(trajectory_batch(V, [eps[i] for i in perm]), cfg)
    assert torch.equal(a.batch["rollout_is_weights"][perm], b.batch["rollout_is_weights"])
    assert torch.equal(a.batch["response_mask"][perm], b.batch["response_mask"])


def test_layout_options(V):
    from interq.integrations.verl import InterqVerlError

    eps = make_episodes(n_traj=3, seed=8)
    rows = step_rows(eps)
    b = step_batch(V, rows)
    # layout=trajectory ignores traj_uid: every row is its own single-turn trajectory (no prefix weight)
    out, m = V.helper.compute_rollout_correction_and_add_to_batch(clone(b), rc_config("interq", layout="trajectory"))
    assert m["rollout_corr/interq/lambda_abs_mean"] == 0.0
    # custom field names
    b2 = clone(b)
    b2.non_tensor_batch["episode"] = b2.non_tensor_batch.pop("traj_uid")
    b2.non_tensor_batch["turn"] = b2.non_tensor_batch.pop("step_idx")
    out2, _ = V.helper.compute_rollout_correction_and_add_to_batch(b2, rc_config("interq", traj_key="episode", step_key="turn"))
    out1, _ = V.helper.compute_rollout_correction_and_add_to_batch(clone(b), rc_config("interq"))
    assert torch.equal(out1.batch["rollout_is_weights"], out2.batch["rollout_is_weights"])
    # traj_uid without a step index: a clear error, not a silent per-row correction
    b3 = clone(b)
    del b3.non_tensor_batch["step_idx"]
    with pytest.raises(InterqVerlError, match="step_idx"):
        V.helper.compute_rollout_correction_and_add_to_batch(b3, rc_config("interq"))
    with pytest.raises(InterqVerlError, match="traj_uid"):
        V.helper.compute_rollout_correction_and_add_to_batch(trajectory_batch(V, eps), rc_config("interq", layout="step"))
    b4 = clone(b)
    b4.non_tensor_batch["step_idx"] = b4.non_tensor_batch["step_idx"].astype(np.float64)
    with pytest.raises(InterqVerlError, match="integer"):
        V.helper.compute_rollout_correction_and_add_to_batch(b4, rc_config("interq"))


def test_auto_layout_without_traj_uid_warns_once():
    """layout=auto on a batch without traj_uid falls back to one row per trajectory and says so, once, naming the
    missing field and what it costs. Pure Python (the correction module imports neither verl nor Ray): it runs
    without verl, on a stand-in with DataProto's shape."""
    import types
    import warnings

    from interq.integrations.verl import correction

    mask = torch.ones(2, 3)
    opts = correction.VerlInterqOptions()
    no_uid = types.SimpleNamespace(batch={"response_mask": mask}, non_tensor_batch={})
    correction._WARNED.clear()
    with pytest.warns(UserWarning, match="no 'traj_uid' field") as rec:
        assert correction.layout_ids(no_uid, opts) == (None, None)
    assert "loses its earlier turns" in str(rec[0].message) and "layout=trajectory" in str(rec[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per process: the hook runs every step
        correction.layout_ids(no_uid, opts)
        assert correction.layout_ids(no_uid, correction.VerlInterqOptions(layout="trajectory")) == (None, None)
        with_uid = types.SimpleNamespace(batch={"response_mask": mask}, non_tensor_batch={
            "traj_uid": np.array(["a", "a"], dtype=object), "step_idx": np.array([0, 1])})
        traj, step = correction.layout_ids(with_uid, opts)
        assert traj.tolist() == [0, 0] and step.tolist() == [0, 1]


# ---------------------------------------------------------------------------------------------------
# Clear errors


@functools.lru_cache(maxsize=1)
def _generated_ppo_trainer_yaml():
    from omegaconf import OmegaConf

    import verl

    return OmegaConf.load(os.path.join(os.path.dirname(verl.__file__), "trainer/config/_generated_ppo_trainer.yaml"))


def _full_config(**rollout_corr):
    """verl's full PPO trainer config (its generated yaml) with algorithm.rollout_correction overrides."""
    from omegaconf import OmegaConf, open_dict

    full = copy.deepcopy(_generated_ppo_trainer_yaml())
    with open_dict(full):
        for k, v in rollout_corr.items():
            OmegaConf.update(full, f"algorithm.rollout_correction.{k}", v, force_add=True)
    return full


def test_errors_options_and_bypass(V):
    from interq.integrations.verl import InterqVerlError

    batch = trajectory_batch(V, make_episodes(seed=9))
    with pytest.raises(InterqVerlError, match=r"algorithm\.rollout_correction\.interq\.budgte.*accepted: budget"):
        V.helper.compute_rollout_correction_and_add_to_batch(clone(batch), rc_config("interq", budgte=0.5))
    with pytest.raises(InterqVerlError, match=r"interq\.budget must be a number"):
        V.helper.compute_rollout_correction_and_add_to_batch(clone(batch), rc_config("interq", budget="big"))
    with pytest.raises(InterqVerlError, match=r"budget must be >= 0"):
        V.helper.compute_rollout_correction_and_add_to_batch(clone(batch), rc_config("interq", budget=-1.0))
    with pytest.raises(InterqVerlError, match="layout='rows' is not accepted; accepted: auto, trajectory, step"):
        V.helper.compute_rollout_correction_and_add_to_batch(clone(batch), rc_config("interq", layout="rows"))
    out, _ = V.helper.compute_rollout_correction_and_add_to_batch(clone(batch), rc_config("interq", budget="inf"))
    assert out.batch["rollout_is_weights"].isfinite().all()
    # bypass mode: verl's apply_bypass_mode (wrapped) refuses an interq method
    cfg = rc_config("interq")
    cfg.bypass_mode = True
    with pytest.raises(InterqVerlError, match="bypass_mode=false"):
        V.helper.apply_bypass_mode(batch=clone(batch), rollout_corr_config=cfg, policy_loss_config={})


def test_error_missing_rollout_log_probs(V):
    from interq.integrations.verl import InterqVerlError

    batch = trajectory_batch(V, make_episodes(seed=10))
    batch.batch.pop("rollout_log_probs")
    with pytest.raises(InterqVerlError, match="calculate_log_probs=true"):
        V.helper.compute_rollout_correction_and_add_to_batch(batch, rc_config("interq"))


def test_validate_config_fails_fast(V):
    """verl.utils.config.validate_config (main_ppo calls it before Ray starts) checks an interq run."""
    from interq.integrations.verl import InterqVerlError

    check = V.plugin.check_verl_config
    assert check(_full_config()) is None  # verl defaults: not ours
    assert check(_full_config(rollout_is="interq", **{"interq.budget": 0.5})) == "interq"
    with pytest.raises(InterqVerlError, match="bypass_mode=false"):
        check(_full_config(rollout_is="interq", bypass_mode=True))
    with pytest.raises(InterqVerlError, match="unknown option"):
        check(_full_config(rollout_is="prefix_is", **{"interq.cap": 2.0}))
    cfg = _full_config(rollout_is="interq_uniform")
    cfg.actor_rollout_ref.rollout.calculate_log_probs = False
    with pytest.raises(InterqVerlError, match="calculate_log_probs=true"):
        check(cfg)
    import verl.utils.config as vc

    with pytest.raises(InterqVerlError, match="bypass_mode=false"):  # through verl's own entry point
        vc.validate_config(config=_full_config(rollout_is="interq", bypass_mode=True), use_reference_policy=False, use_critic=False)


def test_advantage_guard_when_verl_skipped_the_hook(V):
    """verl skips the correction silently without rollout_log_probs; the advantage step then raises."""
    from interq.integrations.verl import InterqVerlError

    batch = trajectory_batch(V, make_episodes(seed=11))
    batch.batch.pop("rollout_log_probs")
    algo = _full_config(rollout_is="interq").algorithm
    with pytest.raises(InterqVerlError, match="calculate_log_probs=true"):
        V.plugin._check_weights_present(batch, algo)
    ok, _ = V.helper.compute_rollout_correction_and_add_to_batch(trajectory_batch(V, make_episodes(seed=11)), rc_config("interq"))
    V.plugin._check_weights_present(ok, algo)  # weights present: fine
    V.plugin._check_weights_present(batch, _full_config(rollout_is="token").algorithm)  # verl's level: not ours


def test_error_when_verl_lost_the_private_function(V, monkeypatch):
    """A verl whose rollout-correction entry point is gone: load warns, an interq run fails with the reason."""
    import types

    from interq.integrations.verl import InterqVerlError

    monkeypatch.setattr(V.plugin.STATE, "errors", {})
    V.plugin._patch_helper(types.ModuleType("verl.trainer.ppo.rollout_corr_helper"))
    assert "compute_rollout_correction_and_add_to_batch" in V.plugin.STATE.errors["rollout_corr"]
    with pytest.raises(InterqVerlError, match=r"has no verl\.trainer\.ppo\.rollout_corr_helper\.compute_rollout_correction_and_add_to_batch.*verl>=0\.9\.1,<0\.10"):
        V.plugin.check_verl_config(_full_config(rollout_is="interq"))
    assert V.plugin.check_verl_config(_full_config(rollout_is="token")) is None  # verl's own levels still run


def test_verl_version_is_in_the_supported_range(V):
    assert V.plugin._version_supported(V.verl.__version__), V.verl.__version__
    assert not V.plugin._version_supported("0.10.0")
    assert not V.plugin._version_supported("0.8.5")


# ---------------------------------------------------------------------------------------------------
# The documented run lines (docs/verl.md) compose with verl's hydra config and pass the plugin's check


def _doc_run_block(marker: str):
    """(exported variables, hydra overrides, dataset command lines) of the docs' bash block holding ``marker``."""
    import re

    path = os.path.join(os.path.dirname(__file__), os.pardir, "docs", "verl.md")
    text = open(path, encoding="utf-8").read()
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    block = next(b for b in blocks if "verl.trainer.main_ppo" in b and marker in b)
    env, overrides, datasets, in_ppo = {}, [], [], False
    for line in block.splitlines():
        line = line.split("#", 1)[0].strip().rstrip("\\").strip()
        if line.startswith("export "):
            k, v = line[len("export "):].split("=", 1)
            env[k] = v
        elif line.startswith("python -m interq.integrations.verl.dataset"):
            datasets.append(line.split()[3:])
        elif line.startswith("python -m verl.trainer.main_ppo"):
            in_ppo = True
        elif in_ppo and "=" in line:
            overrides.append(line)
    return env, overrides, datasets


DOC_RUNS = {  # marker -> (INTERQ_VERL_ALIGN, rollout.quantization, agent loop)
    "tool_agent": ("fp8_block128", "fp8", "tool_agent"),
    "alfworld": ("w8a8_int8_kv_int8", "w8a8_int8", "interq_env"),
    "household": ("w8a8_int8_kv_int8", "w8a8_int8", "interq_env"),
}


@pytest.mark.parametrize("marker", list(DOC_RUNS))
def test_documented_run_lines_compose_with_verl_hydra_config(V, marker, tmp_path):
    from hydra import compose, initialize_config_dir

    from interq.integrations.verl import engine
    from interq.integrations.verl.correction import parse_options
    from interq.integrations.verl.dataset import main as dataset_main
    from interq.integrations.verl.w8a8 import kv_of_cache_dtype

    align, quantization, loop = DOC_RUNS[marker]
    env, overrides, datasets = _doc_run_block(marker)
    assert env == {"VERL_ENGINE_VENDOR": engine.VENDOR, "INTERQ_VERL_ALIGN": align}
    assert engine.align_qcfg(env["INTERQ_VERL_ALIGN"]) is not None
    with initialize_config_dir(config_dir=os.path.join(os.path.dirname(V.verl.__file__), "trainer/config"), version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=overrides)
    assert V.plugin.check_verl_config(cfg) == "interq"
    rollout = cfg.actor_rollout_ref.rollout
    assert rollout.quantization == quantization
    assert parse_options(cfg.algorithm.rollout_correction).budget == 0.5
    if loop == "tool_agent":
        assert rollout.multi_turn.enable is True and rollout.agent.default_agent_loop == "tool_agent"
        assert dict(cfg.ray_kwargs.ray_init.runtime_env.env_vars) == env
        return
    assert rollout.agent.default_agent_loop == "interq_env" and rollout.load_format == "dummy"
    kv = kv_of_cache_dtype(rollout.engine_kwargs.vllm.kv_cache_dtype)
    assert engine.W8A8_PRESETS[kv] == align  # the aligned engine runs the rollout's numerics
    from interq.integrations.verl.w8a8 import check_rollout_config

    assert check_rollout_config(cfg, env) == kv
    assert cfg.actor_rollout_ref.model.override_config.attn_implementation == "sdpa"
    assert rollout.response_length == cfg.data.max_response_length and rollout.calculate_log_probs is True
    if marker == "household":  # the dataset commands run here (household is built in)
        for args in datasets:
            out = tmp_path / os.path.basename(args[args.index("--out") + 1])
            args[args.index("--out") + 1] = str(out)
            assert dataset_main(args) == 0 and out.is_file()


def test_hooks_bind_in_verl_trainers(V):
    """The real trainer modules (v1 default and v0) see the wrapped functions; the advantage guard fires there.

    verl 0.9.1's trainers import cachetools / fastapi / uvicorn / transfer_queue, which verl does not declare.
    """
    for mod in ("cachetools", "fastapi", "uvicorn", "transfer_queue"):
        pytest.importorskip(mod, reason=f"verl's trainer modules need {mod}")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # optional engines (megatron, veomni, ...) missing on CPU
        import verl.trainer.main_ppo as main_ppo
        import verl.trainer.ppo.ray_trainer as v0
        import verl.trainer.ppo.v1.trainer_base as v1
        import verl.trainer.ppo.v1.utils as v1_utils

    from interq.integrations.verl import InterqVerlError

    assert V.plugin.STATE.errors == {}
    assert v1.compute_rollout_correction_and_add_to_batch is V.helper.compute_rollout_correction_and_add_to_batch
    assert hasattr(main_ppo.validate_config, "__interq_original__")
    assert hasattr(v1_utils.compute_advantage_for_multi_trajectories, "__interq_original__")
    algo = _full_config(rollout_is="interq").algorithm
    batch = trajectory_batch(V, make_episodes(n_traj=4, seed=12))
    batch.batch["token_level_rewards"] = torch.zeros_like(batch.batch["old_log_probs"])
    batch.non_tensor_batch["uid"] = np.array(["a", "a", "b", "b"], dtype=object)
    skipped = clone(batch)
    skipped.batch.pop("rollout_log_probs")
    with pytest.raises(InterqVerlError, match="calculate_log_probs=true"):
        v0.compute_advantage(skipped, adv_estimator="grpo", config=algo)
    corrected, _ = V.helper.compute_rollout_correction_and_add_to_batch(clone(batch), rc_config("interq"))
    out = v0.compute_advantage(corrected, adv_estimator="grpo", config=algo)
    assert "advantages" in out.batch.keys()
