"""``build_batch`` on real episodes (toy env, tiny policy): GiGPO's per-turn advantages and their broadcast to the
action tokens against a naive loop (spec §6), and the rule that only actions the environment received are trained,
in both layouts (docs/algorithm.md, "The two layouts")."""

import dataclasses
import statistics

import pytest
import torch

from interq.algo.corrections import compute_correction
from interq.train.config import build_config
from interq.train.pipeline import prepare_policy

TOY = ["env.name=toy", "env.max_turns=4", "env.num_train_tasks=16", "env.num_eval_tasks=4", "env.env_kwargs={length: 2}",
       "model.vocab_size=300", "model.hidden_size=32", "model.intermediate_size=64", "model.num_heads=2",
       "model.num_kv_heads=1", "warm_start.num_demos=16", "warm_start.steps=40", "warm_start.episodes_per_microbatch=8",
       "train.tasks_per_step=4", "train.episodes_per_task=4", "train.progress=false", "rollout.max_action_tokens=8",
       "algo.advantage=gigpo"]


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory):
    # 40 warm-start steps: some actions are valid, so rewards (and GiGPO advantages) differ inside groups
    path, _ = prepare_policy(build_config("bf16", TOY), tmp_path_factory.mktemp("policy") / "p", log=lambda *_: None)
    return path


def _episodes(policy_dir, extra=(), max_context_tokens=None):
    from interq.rollout import RolloutEngine
    from interq.train import rl
    from interq.train.build import build_executor, chat_format, env_factory, split_tasks
    from interq.train.policy import load_policy

    cfg = build_config("bf16", TOY + list(extra))
    model, tok = load_policy(policy_dir)
    fmt = chat_format(tok)
    ex = build_executor(model, cfg.rollout)
    make_env = env_factory(cfg.env)
    train_tasks, _ = split_tasks(make_env, cfg.env)
    engine = RolloutEngine(ex.module, cache_factory=ex.cache_factory, pad_token_id=fmt.pad_token_id,
                           max_context_tokens=max_context_tokens)
    tasks, seeds, groups = rl.step_tasks(train_tasks, cfg, 1)
    eps = rl.rollout(engine, fmt, make_env, tasks, seeds, groups, rl.sampling_params(cfg, fmt), cfg)
    return cfg, eps, fmt.pad_token_id


# ------------------------------------------------------------------------------------------ naive references


def _norm(values, i, members, use_std):
    """(x_i - mean) / (std + 1e-6) over a group (unbiased std; 0 for a singleton), or x_i - mean."""
    if len(members) == 1:
        return 0.0
    xs = [values[j] for j in members]
    mean = sum(xs) / len(xs)
    return (values[i] - mean) / (statistics.stdev(xs) + 1e-6) if use_std else values[i] - mean


def naive_gigpo(episodes, gamma, omega, use_std):
    """Spec §6 with Python loops: A[i][t] = A_E[i] + omega * A_S[i][t]."""
    returns = [sum(ep.rewards) for ep in episodes]
    out = []
    for i, ep in enumerate(episodes):
        same_group = [j for j, e in enumerate(episodes) if e.group == ep.group]
        a_e = _norm(returns, i, same_group, use_std)
        row = []
        for t in range(ep.num_turns):
            steps = [(j, k) for j in same_group for k in range(episodes[j].num_turns)
                     if episodes[j].anchors[k] == ep.anchors[t]]
            ret = {(j, k): sum(gamma ** (m - k) * episodes[j].rewards[m] for m in range(k, episodes[j].num_turns))
                   for j, k in steps}
            a_s = _norm(ret, (i, t), steps, use_std)
            row.append(a_e + omega * a_s)
        out.append(row)
    return out


def naive_token_advantages(batch, episodes, per_turn_adv, layout):
    """Each row's advantages token by token: the advantage of the turn the token's action belongs to."""
    out = torch.zeros_like(batch.advantages)
    b = 0
    for i, ep in enumerate(episodes):
        for t0, traj in enumerate(ep.rows):
            for pos in range(len(traj)):
                if not bool(traj.action_mask[pos]):
                    continue
                turn = int(traj.turn_index[pos]) if layout == "concatenated" else t0
                if turn < ep.num_turns:  # an action the environment received
                    out[b, pos] = per_turn_adv[i][turn]
            b += 1
    return out


@pytest.mark.parametrize("layout", ["concatenated", "per_turn"])
@pytest.mark.parametrize("use_std", [True, False])
def test_gigpo_turn_advantages_and_token_broadcast_match_a_naive_loop(policy_dir, layout, use_std):
    from interq.train import rl

    cfg, eps, pad = _episodes(policy_dir, [f"algo.layout={layout}", "rollout.history_turns=1",
                                           f"algo.grpo_std={str(use_std).lower()}", "algo.gigpo_omega=0.7"])
    batch = rl.build_batch(eps, cfg.algo, pad)
    naive = naive_gigpo(eps, cfg.algo.gigpo_gamma, cfg.algo.gigpo_omega, use_std)
    a_turn, _, _ = rl.turn_advantages(eps, cfg.algo)
    for i, ep in enumerate(eps):
        assert a_turn[i] == pytest.approx(naive[i], rel=1e-5, abs=1e-6), f"episode {i}: rewards {ep.rewards}"
    # not vacuous: episode-level and step-level terms both non-zero somewhere
    assert any(abs(v) > 1e-3 for row in naive for v in row)
    a_e_only = naive_gigpo(eps, cfg.algo.gigpo_gamma, 0.0, use_std)
    assert any(abs(a - b) > 1e-3 for r1, r2 in zip(naive, a_e_only) for a, b in zip(r1, r2)), "A_S is 0 everywhere"
    expected = naive_token_advantages(batch, eps, naive, layout)  # [B, L]
    torch.testing.assert_close(batch.advantages, expected, rtol=1e-5, atol=1e-6)
    assert bool((batch.advantages[~batch.action_mask] == 0).all())


def test_grpo_broadcasts_the_episode_advantage_to_every_received_action(policy_dir):
    from interq.train import rl

    cfg, eps, pad = _episodes(policy_dir, ["algo.layout=concatenated", "algo.advantage=grpo"])
    batch = rl.build_batch(eps, cfg.algo, pad)
    returns = [sum(ep.rewards) for ep in eps]
    naive = [[_norm(returns, i, [j for j, e in enumerate(eps) if e.group == ep.group], cfg.algo.grpo_std)] * ep.num_turns
             for i, ep in enumerate(eps)]
    assert any(abs(v) > 1e-3 for row in naive for v in row)
    torch.testing.assert_close(batch.advantages, naive_token_advantages(batch, eps, naive, "concatenated"),
                               rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------------------------ cut actions

CUT_CONTEXT = 97  # toy prompts: first observation 45 tokens, each later one 40; an 8-token action is cut at 97


def _cut_tokens(ep):
    """(positions, turn) of the concatenated row's action tokens that the environment never received."""
    traj = ep.rows[0]
    pos = [p for p in range(len(traj)) if bool(traj.action_mask[p]) and int(traj.turn_index[p]) >= ep.num_turns]
    return pos


def _per_turn_copy(ep):
    """The same episode in the per-turn layout with the full history: row t = the concatenated row up to the end
    of action t, action mask on action t only. The cut action keeps its row here (the loop drops it), so
    ``build_batch`` itself must leave it untrained."""
    traj, rows = ep.rows[0], []
    for t, span in enumerate(traj.turns):
        if span.act_end == span.act_start:
            continue
        mask = torch.zeros(span.act_end, dtype=torch.bool)
        mask[span.act_start: span.act_end] = True
        rows.append((t, dataclasses.replace(
            traj, token_ids=traj.token_ids[: span.act_end], action_mask=mask,
            behavior_logprobs=torch.where(mask, traj.behavior_logprobs[: span.act_end], torch.zeros(span.act_end)),
            turn_index=traj.turn_index[: span.act_end], turns=traj.turns[: t + 1])))
    assert [t for t, _ in rows] == list(range(len(rows))), "every turn of the toy episode has an action"
    return dataclasses.replace(ep, rows=[r for _, r in rows])


def _trained(batch):
    """{(episode, position in the concatenated row): (advantage, behavior log-prob)} of the trained tokens."""
    out = {}
    for b, i in enumerate(batch.row_episode):
        for p in torch.nonzero(batch.action_mask[b]).flatten().tolist():
            key = (i, p)  # per-turn rows are prefixes of the concatenated row: same positions
            assert key not in out, f"token {key} trained twice (row {b})"
            out[key] = (float(batch.advantages[b, p]), float(batch.behavior_logprobs[b, p]), b, p)
    return out


@pytest.mark.parametrize("advantage", ["grpo", "gigpo"])
def test_an_action_cut_by_the_context_limit_is_trained_in_neither_layout(policy_dir, advantage):
    from interq.train import rl

    cfg, eps, pad = _episodes(policy_dir, ["algo.layout=concatenated", f"algo.advantage={advantage}"],
                              max_context_tokens=CUT_CONTEXT)
    cut = {i: _cut_tokens(ep) for i, ep in enumerate(eps)}
    assert sum(bool(v) for v in cut.values()) >= 3, f"too few episodes cut mid-action: {cut}"
    concat = rl.build_batch(eps, cfg.algo, pad)
    per_turn_cfg = dataclasses.replace(cfg.algo, layout="per_turn")
    copies = [_per_turn_copy(ep) for ep in eps]
    assert [len(c.rows) for c in copies] == [ep.num_turns + bool(cut[i]) for i, ep in enumerate(eps)]
    per_turn = rl.build_batch(copies, per_turn_cfg, pad)

    for i, positions in cut.items():  # the cut action: off the action mask and advantage 0, in both layouts
        if not positions:
            continue
        assert not bool(concat.action_mask[i, positions].any())
        assert bool((concat.advantages[i, positions] == 0).all())
        last = max(b for b, e in enumerate(per_turn.row_episode) if e == i)  # the cut turn's row
        assert not bool(per_turn.action_mask[last].any()) and bool((per_turn.advantages[last] == 0).all())
    # the layouts train the same tokens with the same advantages and behaviour log-probs
    tc, tp = _trained(concat), _trained(per_turn)
    assert tc.keys() == tp.keys() and len(tc) > 0
    for key in tc:
        assert tc[key][:2] == pytest.approx(tp[key][:2], rel=1e-6, abs=1e-7), key
    assert any(abs(v[0]) > 1e-3 for v in tc.values()), "all advantages 0: the comparison would be vacuous"
    # and the correction sees the same segments: identical InterQ weights (spec §5) for a drift that grows per token
    def prox(batch, trained):
        p = batch.behavior_logprobs.clone()
        for (i, pos), (_, _, b, q) in trained.items():
            p[b, q] += 0.05 * ((pos * 7 + i) % 5 - 2)
        return p
    w_c = compute_correction("interq", prox(concat, tc), concat.behavior_logprobs, concat.action_mask).weights
    w_p = compute_correction("interq", prox(per_turn, tp), per_turn.behavior_logprobs, per_turn.action_mask,
                             traj_id=per_turn.traj_id, turn_idx=per_turn.turn_idx).weights
    for key in tc:
        assert float(w_c[tc[key][2], tc[key][3]]) == pytest.approx(float(w_p[tp[key][2], tp[key][3]]), rel=1e-5), key


def test_the_per_turn_loop_drops_a_cut_action_and_build_batch_trains_every_received_one(policy_dir):
    from interq.train import rl

    # per-turn prompts (history_turns=1) are 69-84 tokens: at 85 some actions are cut while being generated
    cfg, eps, pad = _episodes(policy_dir, ["algo.layout=per_turn", "rollout.history_turns=1"], max_context_tokens=85)
    assert any(ep.context_truncated for ep in eps)
    assert all(len(ep.rows) == ep.num_turns for ep in eps)
    batch = rl.build_batch(eps, cfg.algo, pad)
    for b, i in enumerate(batch.row_episode):
        assert bool(batch.action_mask[b].any()), f"row {b} (episode {i}) has a received action and must be trained"


def test_the_warm_start_says_its_size_before_the_first_step(tmp_path):
    """A pretrained model's first fine-tuning step can take minutes on a CPU: the size of a step is said before it."""
    lines: list[str] = []
    prepare_policy(build_config("bf16", TOY + ["warm_start.steps=2"]), tmp_path / "p", log=lines.append)
    first = next(i for i, line in enumerate(lines) if line.startswith("[warm start]"))
    assert "2 steps of 8 of" in lines[first] and "tokens a step" in lines[first]
    assert lines[first + 1].startswith("[warm start] step 1/2")
