"""The agent loop's pure pieces: index actions, rendering; a toy episode through the real engine."""

import pytest
import torch

from interq.agent.loop import make_render, parse_index, play_episodes
from interq.agent.toy_env import ToyEnv
from interq.envs.base import Observation, TaskSpec

TASK = TaskSpec(env="toy", task_id="t", split="train", description="say cup then pan")


def test_parse_index_maps_numbers_and_rejects_the_rest():
    adm = ("go to fridge 1", "look")
    assert parse_index(" 2 ", adm).action == "look" and parse_index("2", adm).valid
    for bad in ("0", "3", "two", "", "1 2", "go to fridge 1"):
        assert not parse_index(bad, adm).valid, bad
    assert not parse_index("1", None).valid


def test_render_first_turn_has_task_later_turns_only_new_text():
    obs = Observation(text="word 1 of 2?", admissible_actions=("cup", "pan"))
    r = make_render(True, numbered=True)
    assert r(TASK, obs, 0, [], None) == "Task: say cup then pan\nword 1 of 2?\nActions: 1 cup; 2 pan"
    assert r(TASK, obs, 1, [("x", "cup")], None) == "word 1 of 2?\nActions: 1 cup; 2 pan"
    assert "x\n> cup" in r(TASK, obs, 1, [("x", "cup")], 1)  # per-turn window carries the history


def test_toy_episodes_through_the_engine_record_rewards_and_rows():
    from interq.rollout import MinimalChatFormat, RolloutEngine, SamplingParams
    from interq.train.config import ModelConfig
    from interq.train.policy import build_tiny_policy

    model, tok = build_tiny_policy(ModelConfig(vocab_size=300, hidden_size=16, intermediate_size=32, num_heads=2,
                                               num_kv_heads=1, head_dim=8), ["say cup then pan", "1 cup; 2 pan"] * 5)
    fmt = MinimalChatFormat(tok)
    engine = RolloutEngine(model, pad_token_id=fmt.pad_token_id)
    env = ToyEnv(length=2, num_words=2)
    tasks = env.tasks("train")[:2]
    sp = SamplingParams(temperature=1.0, max_action_tokens=2, stop_token_ids=fmt.stop_token_ids)
    for layout in ("concatenated", "per_turn"):
        eps = play_episodes(engine, fmt, lambda: ToyEnv(length=2, num_words=2, max_steps=3), tasks, [1, 2], [0, 1], sp,
                            max_turns=3, layout=layout, render=make_render(True, True), action_by_index=True)
        for ep in eps:
            assert 1 <= ep.num_turns <= 3 and len(ep.anchors) == ep.num_turns
            assert len(ep.rows) == (1 if layout == "concatenated" else ep.num_turns)
            assert ep.won == (ep.rewards[-1] >= 10 - 1e-9)
            for row in ep.rows:
                assert torch.all(row.behavior_logprobs[~row.action_mask] == 0)


class ForcedToy(ToyEnv):
    """The toy environment with the win forced on some tasks: whatever the policy says there is read as the expert's
    word, so those episodes win (reward 10 on the last correct word) whatever the tiny policy generates."""

    FORCED = ("train-0", "train-2")

    def parse_action(self, generated_text):
        from interq.envs.base import ParsedAction

        if self._task.task_id in self.FORCED:
            return ParsedAction(action=self.expert_action(), valid=True)
        return super().parse_action(generated_text)


@pytest.mark.parametrize("layout", ["concatenated", "per_turn"])
def test_won_episodes_end_with_reward_10_and_lost_ones_do_not(layout):
    """'won implies last reward 10' on episodes that do win (the check above never sees a win)."""
    from interq.rollout import MinimalChatFormat, RolloutEngine, SamplingParams
    from interq.train.config import ModelConfig
    from interq.train.policy import build_tiny_policy

    model, tok = build_tiny_policy(ModelConfig(vocab_size=300, hidden_size=16, intermediate_size=32, num_heads=2,
                                               num_kv_heads=1, head_dim=8), ["say cup then pan", "apple bread"] * 5)
    fmt = MinimalChatFormat(tok)
    engine = RolloutEngine(model, pad_token_id=fmt.pad_token_id)
    env = ForcedToy(length=3, num_words=2)
    tasks = env.tasks("train")[:4]
    sp = SamplingParams(temperature=1.0, max_action_tokens=2, stop_token_ids=fmt.stop_token_ids)
    eps = play_episodes(engine, fmt, lambda: ForcedToy(length=3, num_words=2, max_steps=5), tasks, [1, 2, 3, 4],
                        [0, 1, 2, 3], sp, max_turns=5, layout=layout, render=make_render(True, False))
    won = [ep for ep in eps if ep.won]
    assert [ep.task.task_id for ep in won] == list(ForcedToy.FORCED)  # the forced ones win; the tiny policy never does
    for ep in eps:
        assert ep.won == (ep.rewards[-1] == 10.0), (ep.task.task_id, ep.rewards)
        assert all(r < 10.0 for r in ep.rewards[:-1])
        if ep.won:
            assert ep.terminated and not ep.truncated and ep.num_turns == 3 and ep.episode_return == pytest.approx(10.0)
        else:
            assert ep.truncated and not ep.terminated
        assert len(ep.rows) == (1 if layout == "concatenated" else ep.num_turns)


@pytest.mark.parametrize("window", [0, 1, 3])
def test_per_turn_prompt_holds_exactly_the_last_k_turns(window):
    """rollout.history_turns=k re-renders the task, the last k (observation, action) pairs and the current
    observation; 0 renders no earlier turn (the documented meaning)."""
    from interq.agent.loop import make_render
    from interq.envs.base import Observation, TaskSpec

    render = make_render(True, True)
    task = TaskSpec(env="toy", task_id="t0", split="train", task_type="x", description="reach the goal.")
    history = [(f"obs {i}", f"act {i}") for i in range(5)]
    text = render(task, Observation(text="now here", admissible_actions=["go"]), 5, history, window)
    shown = [i for i in range(5) if f"obs {i}\n> act {i}" in text]
    assert shown == list(range(5 - window, 5))
    assert text.startswith("Task: reach the goal.") and "now here" in text and "Actions: 1 go" in text
