"""Environments through the trainer: the worker pool in the agent loop, the benchmark presets, prompts
for pretrained policies.

- Equivalence: the same seeds give identical episodes in-process and through an EnvPool (household; one wave and
  waves of fewer workers than episodes; both layouts).
- A worker killed (and one hung) in the middle of a training step costs only its episodes: the run goes on, the
  step's metrics say ``env/failed_episodes``, the pool replaces the workers.
- ``interq train`` end to end on alfworld, scienceworld and synthshop (tiny policy, CI-sized), through the pool.
- ``interq train model.source=smollm2 env.name=alfworld``: verl-agent's prompt, actions in ``<action>`` tags.
"""

from __future__ import annotations

import functools
import json
import time

import pytest
import torch

from interq.cli import main
from interq.envs import make_env
from interq.envs.pool import EnvPool, FaultInjectionEnv
from interq.train.config import build_config
from train_helpers import rollout_episodes, warm_start

SIZES = {"train": 24, "valid_seen": 4, "valid_unseen": 8}
HOUSEHOLD = ["env.name=household", f"env.env_kwargs={{split_sizes: {json.dumps(SIZES)}}}", "env.num_train_tasks=24",
             "env.num_eval_tasks=4", "env.max_turns=5", "model.vocab_size=400", "model.hidden_size=32",
             "model.intermediate_size=64", "model.num_heads=2", "model.num_kv_heads=1", "warm_start.num_demos=48",
             "warm_start.steps=40", "warm_start.episodes_per_microbatch=16", "train.tasks_per_step=3",
             "train.episodes_per_task=2", "train.progress=false", "train.threads=1", "rollout.max_action_tokens=4"]


@pytest.fixture(scope="module")
def household_policy(tmp_path_factory):
    return warm_start(tmp_path_factory, "household", HOUSEHOLD)


def _episodes(policy_dir, cfg, envs, n_tasks=3):
    """Two episodes of each of the first ``n_tasks`` train tasks, fixed seeds."""
    def pick(train_tasks):
        tasks = [t for t in train_tasks[:n_tasks] for _ in range(2)]
        return tasks, [101 + i for i in range(len(tasks))], [i // 2 for i in range(len(tasks))]

    return rollout_episodes(policy_dir, cfg, pick, envs)[3]


def _same(a, b, exact=True):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert (x.task, x.seed, x.actions, x.rewards, x.valid, x.anchors) == (y.task, y.seed, y.actions, y.rewards, y.valid, y.anchors)
        assert (x.won, x.terminated, x.truncated, x.failed) == (y.won, y.terminated, y.truncated, y.failed)
        assert len(x.rows) == len(y.rows)
        for r, s in zip(x.rows, y.rows):
            assert torch.equal(r.token_ids, s.token_ids) and torch.equal(r.action_mask, s.action_mask)
            if exact:
                assert torch.equal(r.behavior_logprobs, s.behavior_logprobs)
            else:  # another generation batch: the same draws, log-probs to float rounding of the batch's padding
                torch.testing.assert_close(r.behavior_logprobs, s.behavior_logprobs, rtol=0, atol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["per_turn", "concatenated"])
def test_pool_episodes_equal_in_process(household_policy, layout):
    """Same seeds -> identical episodes (actions, rewards, tokens, behaviour log-probs) in-process and through an
    EnvPool with workers >= episodes (one wave: bit-identical); with fewer workers (waves of 4 + 2) the same
    episodes, log-probs equal to the float rounding of a smaller generation batch (padded differently)."""
    from interq.agent.loop import InProcessEnvs, PooledEnvs
    from interq.train.build import env_factory

    # fp32 executor: waves change the generation batch, and a bf16 executor's rounding (2^-8) of another batch moves
    # log-probs by ~1e-3; in fp32 that is ~1e-6, so the waves' check below stays tight
    cfg = build_config("household", HOUSEHOLD + [f"algo.layout={layout}", "rollout.executor=fp32"])
    ref = _episodes(household_policy, cfg, InProcessEnvs(env_factory(cfg.env)))
    assert sum(ep.num_turns for ep in ref) > len(ref)  # the episodes do step (more than one turn on average)
    assert any(v for ep in ref for v in ep.valid)
    for workers in (6, 4):
        with EnvPool(env_factory(cfg.env), workers) as pool:
            envs = PooledEnvs(pool)
            got = _episodes(household_policy, cfg, envs)
            assert envs.seconds > 0
        _same(ref, got, exact=workers >= len(ref))
    # env.overlap: each wave in two halves, one generating while the other's environments step: the same episodes
    # (sampling is per episode), log-probs to the rounding of a half-size generation batch
    for workers in (6, 4):
        over = build_config("household", HOUSEHOLD + [f"algo.layout={layout}", "rollout.executor=fp32",
                                                      f"env.num_workers={workers}", "env.overlap=true"])
        with EnvPool(env_factory(over.env), workers) as pool:
            got = _episodes(household_policy, over, PooledEnvs(pool))
        _same(ref, got, exact=False)


@pytest.mark.slow
@pytest.mark.parametrize("overlap", [False, True])
def test_killed_and_hung_workers_cost_only_their_episodes(household_policy, tmp_path, overlap):
    """During training step 1, the workers playing one task are SIGKILLed at their 2nd environment step and those
    playing another task hang there: those 4 episodes are recorded as failed (env/failed_episodes), not trained on;
    the step trains on the others, the run goes on (step 2, held-out evaluation, checkpoint), workers replaced."""
    from interq.train import rl
    from interq.train.build import env_factory, split_tasks
    from interq.train.logging import read_jsonl
    from interq.train.policy import load_policy

    cfg = build_config("household", HOUSEHOLD + ["env.num_workers=3", "env.step_timeout_s=4", "train.steps=2",
                                                 "train.eval_every_steps=2", "train.checkpoint_every_steps=2",
                                                 f"env.overlap={str(overlap).lower()}"])
    train_tasks, eval_tasks = split_tasks(env_factory(cfg.env), cfg.env)
    step1, _, _ = rl.step_tasks(train_tasks, cfg, 1)
    die, hang = step1[0].task_id, step1[2].task_id  # 2 episodes each (episodes_per_task=2)
    step2 = {t.task_id for t in rl.step_tasks(train_tasks, cfg, 2)[0]}
    fault = functools.partial(FaultInjectionEnv, env_factory(cfg.env), die_at_step={die: 2}, hang_at_step={hang: 2})
    model, tok = load_policy(household_policy)
    t0 = time.perf_counter()
    recs = rl.train(cfg, tmp_path / "run", model, tok, fault, train_tasks, eval_tasks)
    s1, s2 = recs[1], recs[2]
    assert s1["env/failed_episodes"] == 4
    assert s1["rollout/failed_episodes"] == 4 and s1["rollout/success"] <= 2 / 6
    assert s1["optim/steps"] == 1 and s1["batch/rows"] > 0  # trained on the 2 other episodes
    expected2 = 2 * len(step2 & {die, hang})  # step 2 may draw the faulty tasks again: they fail again
    assert s2["env/failed_episodes"] == expected2
    assert s2["env/worker_restarts"] >= 1  # the killed / hung workers were replaced for step 2
    assert "eval/success" in s2 and (tmp_path / "run" / "checkpoints" / "step_000002").is_dir()
    assert all(r["time/env"] > 0 for r in recs[1:])
    assert time.perf_counter() - t0 < 120


@pytest.mark.slow
def test_failed_episodes_are_left_out_of_the_batch(household_policy):
    """What train() does with a failed episode: its rows are not in the batch, the group baseline is the others'."""
    from interq.train import rl

    cfg = build_config("household", HOUSEHOLD + ["algo.layout=per_turn"])
    eps = _episodes(household_policy, cfg, None, n_tasks=2)
    eps[0].failed = "worker died: exit code -9"
    kept = [ep for ep in eps if not ep.failed]
    batch = rl.build_batch(kept, cfg.algo, 0)
    assert batch.input_ids.shape[0] == sum(len(ep.rows) for ep in kept)
    # episode 1 is alone in group 0 now: its advantage is 0 (GRPO over a group of one)
    assert torch.all(batch.advantages[[r for r, e in enumerate(batch.row_episode) if e == 0]] == 0)


def test_in_process_run_logs_env_metrics(tmp_path):
    """The default (env.num_workers=0) logs env/failed_episodes = 0 and the environment time; env_info.json records
    what the environment played."""
    out = tmp_path / "run"
    args = [*HOUSEHOLD, "warm_start.steps=2", "warm_start.num_demos=8", "train.steps=1", "train.eval_every_steps=0",
            "train.checkpoint_every_steps=0"]
    assert main(["train", "--preset", "household", "--out", str(out), *args]) == 0
    rec = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()][-1]
    assert rec["env/failed_episodes"] == 0 and rec["env/worker_restarts"] == 0 and rec["time/env"] > 0
    # what the environment played is kept with the run and its warm start (HouseholdEnv.info)
    info = json.loads((out / "env_info.json").read_text())
    assert info["env"] == "household" and info["source"] == "generated" and info["version"].startswith("interq ")
    assert info["split_sizes"] == SIZES and info["size"] == "full" and info["shuffle_actions"] is False
    assert all(sum(info["task_types"][s].values()) == n for s, n in SIZES.items())
    assert json.loads((out / "warm_start" / "policy_summary.json").read_text())["env"] == info


# ---------------------------------------------------------------------------------------------- config


@pytest.mark.parametrize("args, needle", [
    (["env.num_workers=-1"], "env.num_workers=-1 is not accepted; it must be an integer >= 0"),
    (["env.num_workers=two"], "env.num_workers: expected an integer"),
    (["env.step_timeout_s=0"], "env.step_timeout_s=0"),
    (["env.overlap=true"], "env.overlap=true needs env.num_workers >= 2 (got 0)"),
    (["env.num_workers=1", "env.overlap=true"], "env.overlap=true needs env.num_workers >= 2 (got 1)"),
    (["env.prompt=fancy"], "env.prompt='fancy' is not accepted; choose one of ['compact', 'verl_agent', 'auto']"),
    (["env.prompt=verl_agent"], "env.prompt='verl_agent' needs env.action_format='text'"),
    (["env.action_format=json"], "choose one of ['text', 'index', 'auto']"),
])
def test_invalid_env_fields_one_line(tmp_path, capsys, args, needle):
    with pytest.raises(SystemExit) as e:
        main(["train", "--out", str(tmp_path / "x"), *args])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1
    assert not (tmp_path / "x").exists()


def test_arms_build_on_the_environment_preset():
    """--preset <arm> env.name=<env>: the arm's settings over the environment's preset (not household's)."""
    env_preset = build_config("alfworld")
    for arm in ("bf16", "q-naive", "q-tis", "q-align", "q-interq"):
        cfg = build_config(arm, ["env.name=alfworld"])
        ref = build_config(arm)
        assert cfg.name == f"{arm}-alfworld"
        assert (cfg.rollout.executor, cfg.algo.align, cfg.algo.correction) == \
            (ref.rollout.executor, ref.algo.align, ref.algo.correction)
        assert cfg.env == env_preset.env and cfg.warm_start == env_preset.warm_start
    assert build_config("q-interq", ["env.name=scienceworld", "name=mine"]).name == "mine"
    assert build_config("bf16", ["env.name=toy"]).env.max_turns == build_config("household").env.max_turns  # no preset
    # auto: index answers under the compact prompt for the tiny policy, <action> text under verl-agent's for a chat model
    assert (env_preset.env.action_format, env_preset.env.prompt) == ("index", "compact")
    chat = build_config("bf16", ["model.source=smollm2", "env.name=alfworld"])  # the CLI's default preset is bf16
    assert (chat.env.action_format, chat.env.prompt) == ("text", "verl_agent")
    assert build_config("household").env.prompt == "compact"  # household unchanged


def test_verl_agent_render_and_demo_answers():
    from interq.envs.base import Observation, TaskSpec
    from interq.envs.prompting import build_prompt
    from interq.train.build import agent_render, demo_answer

    cfg = build_config("bf16", ["model.source=smollm2", "env.name=alfworld"])
    render = agent_render(cfg)
    task = TaskSpec("alfworld", "t", "train", "pick_and_place", "put a mug in cabinet.")
    obs = Observation(text="You arrive at desk 1.", admissible_actions=("look", "go to desk 1"))
    hist = [("o1", "look"), ("o2", "go to desk 1")]
    assert render(task, obs, 2, hist, 1) == build_prompt("put a mug in cabinet.", "You arrive at desk 1.",
                                                         ["look", "go to desk 1"], hist, step=2, history_length=1,
                                                         env_name="alfworld")
    assert "<action> </action>" in render(task, obs, 0, [], None)
    assert demo_answer(cfg)("look") == "<action>look</action>"
    assert demo_answer(build_config("alfworld")) is None


# ---------------------------------------------------------------------------------------------- end to end

# A tiny policy from a config, saved as a checkpoint directory: model.source=<dir> takes warm_start.num_demos as
# given (model.source=tiny records at least 32 demos to train its tokenizer, over a minute of ALFWorld resets).
TINY = ["warm_start.num_demos=2", "warm_start.steps=4", "warm_start.episodes_per_microbatch=2", "warm_start.lr=3e-3",
        "train.tasks_per_step=1", "train.episodes_per_task=2", "train.steps=1", "train.eval_every_steps=1",
        "train.checkpoint_every_steps=1", "train.progress=false", "train.threads=1", "env.num_eval_tasks=2",
        "env.num_train_tasks=2", "rollout.max_action_tokens=8"]
ENV_ARGS = {  # max_turns: room for the expert / gold path to win a demo
    "alfworld": ["env.num_workers=2", "env.max_turns=25",
                 "env.env_kwargs={split_sizes: {train: 2, valid_seen: 1, valid_unseen: 2}}"],
    "scienceworld": ["env.num_workers=2", "env.max_turns=8",
                     "env.env_kwargs={task_names: [find-non-living-thing], max_variations: 2}"],
    "synthshop": ["env.max_turns=8", "env.env_kwargs={split_sizes: {train: 2, valid_seen: 1, valid_unseen: 2}}"],
}


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    from interq.train.config import ModelConfig
    from interq.train.policy import build_tiny_policy, save_policy

    texts = ["go to countertop 1", "take apple 1 from fridge 1", "put mug 2 in/on cabinet 3", "open microwave 1",
             "search[blue cotton t-shirt]", "click[buy now]", "focus on the animal", "look around", "1 2 3 4 5 6 7 8 9"]
    model, tok = build_tiny_policy(ModelConfig(vocab_size=400, hidden_size=32, intermediate_size=64, num_heads=2,
                                               num_kv_heads=1), texts * 4)
    path = tmp_path_factory.mktemp("tiny") / "policy"
    save_policy(model, tok, path)
    return path


@pytest.mark.parametrize("env_name", [pytest.param("alfworld", marks=[pytest.mark.alfworld, pytest.mark.slow]),
                                      pytest.param("scienceworld", marks=[pytest.mark.scienceworld, pytest.mark.slow]),
                                      "synthshop"])
def test_interq_train_end_to_end_on_each_benchmark(tmp_path, env_name, capsys, tiny_checkpoint):
    """Warm start from the env's expert / gold paths, one RL step, held-out evaluation on the unseen split, through
    the worker pool for the slow engines; the run records what the environment played (env_info.json: ALFWorld's
    game source, the others' engine, version, splits and task types)."""
    if env_name == "alfworld":
        pytest.importorskip("alfworld", reason="could not import 'alfworld' (extra interq[alfworld])")
        pytest.importorskip("textworld", reason="could not import 'textworld' (extra interq[alfworld])")
    if env_name == "scienceworld":
        pytest.importorskip("scienceworld", reason="could not import 'scienceworld' (extra interq[scienceworld])")
        import shutil

        if shutil.which("java") is None:
            pytest.skip("ScienceWorld needs java on PATH")
    out = tmp_path / "run"
    t0 = time.perf_counter()
    assert main(["train", "--preset", "q-interq", "--out", str(out), f"env.name={env_name}",
                 f"model.source={tiny_checkpoint}", *TINY,
                 *ENV_ARGS[env_name]]) == 0
    seconds = time.perf_counter() - t0
    recs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs] == [0, 1]
    s1 = recs[1]
    assert s1["env/failed_episodes"] == 0 and "eval/success" in recs[0] and "eval/success" in s1
    assert len(s1["eval/outcomes"]) == 2 and s1["batch/rows"] > 0 and s1["time/env"] > 0
    stored = (out / "config.yaml").read_text()
    assert f"name: q-interq-{env_name}" in stored and "correction: interq" in stored
    summary = json.loads((out / "warm_start" / "policy_summary.json").read_text())
    assert summary["demos"] == 2 and summary["demo_success"] > 0  # expert / gold path demos that win
    info = json.loads((out / "env_info.json").read_text())  # what the environment played, kept with the run
    assert info["env"] == env_name and summary["env"] == info
    if env_name == "alfworld":
        assert info["source"] in ("generated", "official") and info["source_reason"]
    else:  # engine and version, where the tasks come from, split sizes and task types
        assert info["engine"] and info["version"] and info["source"]
        held_out = {"scienceworld": "test", "synthshop": "valid_unseen"}[env_name]
        assert set(info["split_sizes"]) == set(info["task_types"]) and info["split_sizes"][held_out] == 2
    assert "held-out success" in capsys.readouterr().out
    print(f"{env_name}: {seconds:.1f} s")


@pytest.mark.slow
@pytest.mark.smollm2
@pytest.mark.alfworld
def test_smollm2_on_alfworld_with_verl_agent_prompt(tmp_path):
    """interq train model.source=smollm2 env.name=alfworld: SmolLM2-135M-Instruct, verl-agent's prompt, actions in
    <action> tags (warm start on tagged expert answers), 1 RL step of 2 episodes x 2 turns."""
    pytest.importorskip("alfworld", reason="could not import 'alfworld' (extra interq[alfworld])")
    pytest.importorskip("textworld", reason="could not import 'textworld' (extra interq[alfworld])")
    from interq.models.pretrained import smollm2_gguf_path

    try:
        smollm2_gguf_path()
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"SmolLM2 not installed: {e}")
    out = tmp_path / "run"
    args = ["model.source=smollm2", "env.name=alfworld", "env.max_turns=2", "env.num_train_tasks=2",
            "env.num_eval_tasks=1", "env.num_workers=2",
            "env.env_kwargs={split_sizes: {train: 2, valid_seen: 1, valid_unseen: 1}}", "warm_start.num_demos=2",
            "warm_start.steps=1", "warm_start.lr=1e-5", "warm_start.episodes_per_microbatch=2", "optim.lr=1e-6",
            "train.tasks_per_step=1", "train.episodes_per_task=2", "train.steps=1", "train.eval_every_steps=0",
            "train.checkpoint_every_steps=0", "train.progress=false", "rollout.max_action_tokens=16"]
    t0 = time.perf_counter()
    assert main(["train", "--preset", "bf16", "--out", str(out), *args]) == 0
    seconds = time.perf_counter() - t0
    rec = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()][-1]
    stored = (out / "config.yaml").read_text()
    assert "prompt: verl_agent" in stored and "action_format: text" in stored and "name: bf16-alfworld" in stored
    assert rec["step"] == 1 and rec["rollout/length"] <= 2 and rec["batch/rows"] > 0 and rec["optim/steps"] == 1
    print(f"smollm2 alfworld: total {seconds:.1f} s, step: rollout {rec['time/rollout']:.1f} s "
          f"(env {rec['time/env']:.1f} s), learner {rec['time/learner']:.1f} s, sync {rec['time/sync']:.2f} s")
