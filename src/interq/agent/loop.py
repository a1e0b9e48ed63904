"""The agent loop: joins the rollout engine and the environments into scored trajectories.

One call plays a batch of episodes to the end. Each turn the live episodes' new observation text is rendered
by the chat format into token ids, the engine prefills them into the episode's persistent KV cache and samples
the action, the action text is parsed (``env.parse_action``, never raises) and stepped in the environment.
An unparseable action costs ``invalid_action_penalty`` (interq-spec.md §6) and is passed to the environment
as-is (the environment answers with its invalid-action feedback).

Two layouts (interq-spec.md §5):

* ``concatenated``: one engine session per episode for its whole life, the trajectory is one row holding the
  full history (token in, token out).
* ``per_turn``: every turn is a fresh one-turn session whose prompt re-renders the task and the last
  ``history_turns`` (observation, action) pairs (verl-agent's windowed history). Each turn is one row, tagged
  with the episode (``traj_id``) and the turn index.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from interq.envs.base import Observation, ParsedAction, TaskSpec


@dataclass
class Episode:
    """One played episode. ``rows`` holds one Trajectory (concatenated) or one per turn (per_turn)."""

    task: TaskSpec
    group: int                              # index of the task instance within the step (GRPO group)
    seed: int
    rows: list[Any] = field(default_factory=list)  # interq.rollout.Trajectory
    rewards: list[float] = field(default_factory=list)      # per turn, penalty included
    anchors: list[str] = field(default_factory=list)        # per turn: raw state text before the action (GiGPO)
    actions: list[str] = field(default_factory=list)        # per turn: parsed action text
    valid: list[bool] = field(default_factory=list)
    won: bool = False
    terminated: bool = False
    truncated: bool = False                 # step limit or context limit
    context_truncated: bool = False

    @property
    def num_turns(self) -> int:
        return len(self.rewards)

    @property
    def episode_return(self) -> float:
        return float(sum(self.rewards))


def make_render(show_admissible: bool = True, numbered: bool = False) -> Callable[..., str]:
    """A compact observation renderer (a tiny policy cannot afford verl-agent's long prompt; a pretrained chat
    model can use ``interq.envs.prompting.build_prompt`` through the ``render`` argument instead).

    ``window=0`` (per_turn layout, ``rollout.history_turns=0``): the task and the current observation, no earlier turn.

    ``window=None`` (concatenated layout): the first turn carries the task and the observation, later turns only
    the new observation (the history is already in the context). ``window=k`` (per_turn layout): a fresh prompt
    with the task, the last k (observation, action) pairs and the current observation.
    """

    def render(task: TaskSpec, obs: Observation, turn: int, history: Sequence[tuple[str, str]], window: int | None) -> str:
        parts = []
        if (window is not None or turn == 0) and task.description and task.description not in obs.text:
            parts.append(f"Task: {task.description}")
        if window:
            for o, a in history[-window:]:
                parts.append(f"{o}\n> {a}")
        parts.append(obs.text)
        if show_admissible and obs.admissible_actions:
            if numbered:
                parts.append("Actions: " + "; ".join(f"{k} {a}" for k, a in enumerate(obs.admissible_actions, 1)))
            else:
                parts.append("Actions: " + ", ".join(obs.admissible_actions))
        return "\n".join(parts)

    return render


default_render = make_render(True)


def play_episodes(
    engine,
    chat_format,
    make_env: Callable[[], Any],
    tasks: Sequence[TaskSpec],
    seeds: Sequence[int],
    groups: Sequence[int],
    sampling,
    *,
    max_turns: int,
    invalid_action_penalty: float = 0.1,
    layout: str = "concatenated",
    history_turns: int = 0,
    render: Callable[..., str] = default_render,
    action_by_index: bool = False,
) -> list[Episode]:
    """Play ``len(tasks)`` episodes (episode i: ``tasks[i]``, sampling seed ``seeds[i]``) to the end.

    ``action_by_index``: the agent answers with the number of an action in the observation's admissible list
    (rendered numbered); anything else is an unparseable action (penalty, passed on as-is).
    """
    if not (len(tasks) == len(seeds) == len(groups)):
        raise ValueError(f"tasks, seeds and groups must have the same length, got {len(tasks)}, {len(seeds)}, {len(groups)}")
    if layout not in ("concatenated", "per_turn"):
        raise ValueError(f"layout={layout!r}; accepted: 'concatenated', 'per_turn'")
    envs = [make_env() for _ in tasks]
    episodes = [Episode(task=t, group=int(g), seed=int(s)) for t, s, g in zip(tasks, seeds, groups)]
    current = [env.reset(t) for env, t in zip(envs, tasks)]
    history: list[list[tuple[str, str]]] = [[] for _ in tasks]
    try:
        if layout == "concatenated":
            _play_concatenated(engine, chat_format, envs, episodes, current, history, sampling, max_turns,
                               invalid_action_penalty, render, action_by_index)
        else:
            _play_per_turn(engine, chat_format, envs, episodes, current, history, sampling, max_turns,
                           invalid_action_penalty, history_turns, render, action_by_index)
    finally:
        for env in envs:
            try:
                env.close()
            except Exception:
                pass
    return episodes


def parse_index(text: str, admissible: Sequence[str] | None) -> ParsedAction:
    """``"3"`` -> the 3rd admissible action; anything else is unparseable (passed on as-is)."""
    s = text.strip()
    if admissible and s.isdigit() and 1 <= int(s) <= len(admissible):
        return ParsedAction(admissible[int(s) - 1], True)
    return ParsedAction(s, False)


def _apply(i: int, envs, episodes, current, history, text: str, penalty: float, by_index: bool, max_turns: int) -> bool:
    """Parse and step episode ``i``'s action; record reward, anchor and history, advance ``current[i]``,
    enforce the turn limit; return whether the episode is done (both layouts share this)."""
    env, ep, obs = envs[i], episodes[i], current[i]
    parsed = parse_index(text, obs.admissible_actions) if by_index else env.parse_action(text)
    ep.anchors.append(obs.anchor or obs.text)
    ep.actions.append(parsed.action)
    result = env.step(parsed.action)
    valid = bool(parsed.valid and result.info.get("valid_action", True))
    ep.valid.append(valid)
    ep.rewards.append(float(result.reward) - (0.0 if parsed.valid else penalty))
    if result.info.get("won"):
        ep.won = True
    ep.terminated = bool(result.terminated)
    ep.truncated = bool(result.truncated)
    done = bool(result.terminated or result.truncated)
    history[i].append((obs.text, ep.actions[-1]))
    current[i] = result.observation
    if not done and ep.num_turns >= max_turns:
        ep.truncated, done = True, True
    return done


def _play_concatenated(engine, fmt, envs, episodes, current, history, sampling, max_turns, penalty, render, by_index):
    batch = engine.new_batch(seeds=[ep.seed for ep in episodes], sampling=sampling)
    chats = [fmt.start() for _ in episodes]
    obs_ids = {i: chats[i].observation(render(ep.task, current[i], 0, [], None)) for i, ep in enumerate(episodes)}
    turn = 0
    while obs_ids:
        out = batch.step(obs_ids)
        obs_ids = {}
        for i, r in out.items():
            ep = episodes[i]
            text = chats[i].action(r.action_ids)
            if r.truncated:  # context limit: the engine has already closed the episode
                ep.truncated = ep.context_truncated = True
                continue
            done = _apply(i, envs, episodes, current, history, text, penalty, by_index, max_turns)
            if done:
                batch.finish(i)
            else:
                obs_ids[i] = chats[i].observation(render(ep.task, current[i], turn + 1, history[i], None))
        turn += 1
    for i, ep in enumerate(episodes):
        ep.rows = [batch.trajectory(i)]


def _play_per_turn(engine, fmt, envs, episodes, current, history, sampling, max_turns, penalty, window, render, by_index):
    live = list(range(len(episodes)))
    turn = 0
    while live:
        # one fresh session per (episode, turn); the seed mixes the episode seed and the turn
        batch = engine.new_batch(seeds=[episodes[i].seed * 1009 + turn for i in live], sampling=sampling)
        chats = [fmt.start() for _ in live]
        obs_ids = {j: chats[j].observation(render(episodes[i].task, current[i], turn, history[i], window))
                   for j, i in enumerate(live)}
        out = batch.step(obs_ids)
        still = []
        for j, i in enumerate(live):
            ep, r = episodes[i], out[j]
            text = chats[j].action(r.action_ids)
            if not r.truncated:
                batch.finish(j)
            ep.rows.append(batch.trajectory(j))
            if r.truncated:
                ep.truncated = ep.context_truncated = True
                ep.rows.pop()  # a prompt that did not fit has no action to train on
                continue
            done = _apply(i, envs, episodes, current, history, text, penalty, by_index, max_turns)
            if not done:
                still.append(i)
        live = still
        turn += 1
