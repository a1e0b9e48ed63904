"""The agent loop: joins the rollout engine and the environments into scored trajectories.

One call plays a batch of episodes to the end. Each turn the live episodes' new observation text is rendered
by the chat format into token ids, the engine prefills them into the episode's persistent KV cache and samples
the action, the action text is parsed (``env.parse_action``, never raises) and stepped in the environment.
An unparseable action costs ``invalid_action_penalty`` (``env.invalid_action_penalty``) and is passed to the environment
as-is (the environment answers with its invalid-action feedback).

Two layouts (docs/algorithm.md, "The two layouts"):

* ``concatenated``: one engine session per episode for its whole life, the trajectory is one row holding the
  full history (token in, token out).
* ``per_turn``: every turn is a fresh one-turn session whose prompt re-renders the task and the last
  ``history_turns`` (observation, action) pairs (verl-agent's windowed history). Each turn is one row, tagged
  with the episode (``traj_id``) and the turn index.

Where the environments run (``envs``):

* in this process (default, :class:`InProcessEnvs`): one fresh ``make_env()`` per episode, stepped one after
  another, closed at the end (the household path: fast pure Python, nothing to overlap);
* in an :class:`interq.envs.pool.EnvPool` of N worker processes (:class:`PooledEnvs`, ``env.num_workers``): each
  turn's actions are stepped in all workers at once, so slow engines (ALFWorld, ScienceWorld) overlap each other,
  and the workers (a JVM each for ScienceWorld) live for the whole run instead of being built per episode. A batch
  of more episodes than workers is played in *waves* of N episodes, each wave to its end (a wave is the
  in-process loop on its episodes: same seeds, same per-turn seeds, same sampling draws; the engine's generation
  batch is the wave, so behaviour log-probs can differ from one big batch by float rounding of the padding).
  Waves rather than refilling a slot as soon as its episode ends: every episode's KV cache, turn counter and
  per-turn seeds stay as in-process and no row waits inside a batch; the cost is that a wave lasts as long as its
  longest episode and generation runs at batch N. With N >= the batch, one wave: the in-process loop exactly.

With ``overlap`` (``env.overlap``, a pool of N >= 2 workers) each wave is played in two halves, each its own engine
session: one half's actions are submitted to its workers (:meth:`interq.envs.pool.BatchPool.step_submit`) and the
other half generates while they step; its results are collected just before it generates again (a ping-pong
pipeline, :func:`_drive`). The episodes are the same as without it (sampling is per episode; log-probs to the
rounding of a smaller generation batch); the gain is bounded by the smaller of the generation and environment
times per turn, and generating at half the batch costs more forwards (measured: a loss for a
tiny policy with fast environments, a small gain at 100-300 ms a step).

A worker that crashes or hangs costs only its episode: the pool returns a failure result, the episode ends there
with ``Episode.failed`` set to the reason (its last turn recorded with reward 0 and not valid), the other episodes
go on, and the pool replaces the worker at the next wave's reset. A reset that fails is retried once on a fresh
worker by the pool; one that fails again raises :class:`interq.envs.pool.EnvPoolError` (a task that cannot be
started is a set-up error, not a lost episode). Environment time (building in-process envs, resets, steps;
with a pool, the time spent waiting for its answers; seconds) is summed in ``envs.seconds``.
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
    failed: str = ""                        # the environment's worker crashed or hung: the reason ("": it did not)

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


class InProcessEnvs:
    """The episodes' environments in this process: one fresh ``make_env()`` per episode, stepped one after another."""

    capacity: int | None = None  # any number of episodes at once

    def __init__(self, make_env: Callable[[], Any]):
        self.make_env = make_env
        self.envs: list[Any] = []
        self.seconds = 0.0  # time in env reset / step

    def reset(self, tasks: Sequence[TaskSpec]) -> list[Observation]:
        import time

        t0 = time.perf_counter()
        self.envs = [self.make_env() for _ in tasks]  # built per episode (a JVM each for ScienceWorld): env time too
        out = [env.reset(t) for env, t in zip(self.envs, tasks)]
        self.seconds += time.perf_counter() - t0
        return out

    def parse_action(self, i: int, text: str) -> ParsedAction:
        return self.envs[i].parse_action(text)

    def step(self, actions: dict[int, str]) -> dict[int, Any]:
        return self.collect(self.submit(actions))

    def submit(self, actions: dict[int, str]) -> dict[int, Any]:
        """Step now (nothing runs in the background in this process); :meth:`collect` hands the results over."""
        import time

        t0 = time.perf_counter()
        out = {i: self.envs[i].step(a) for i, a in actions.items()}
        self.seconds += time.perf_counter() - t0
        return out

    @staticmethod
    def collect(ticket: dict[int, Any]) -> dict[int, Any]:
        return ticket

    def end(self) -> None:
        for env in self.envs:
            try:
                env.close()
            except Exception:
                pass
        self.envs = []


class PooledEnvs:
    """The episodes' environments in the worker processes of an :class:`interq.envs.pool.EnvPool` (slot i plays
    the wave's episode i); the pool outlives the call (the caller closes it). Actions are parsed by the pool's
    local env (``parse_action`` is pure)."""

    def __init__(self, pool):
        self.pool = pool
        self.capacity = pool.num_envs
        self.seconds = 0.0

    def reset(self, tasks: Sequence[TaskSpec]) -> list[Observation]:
        import time

        t0 = time.perf_counter()
        out = self.pool.reset_batch(list(tasks))[: len(tasks)]
        self.seconds += time.perf_counter() - t0
        return out

    def parse_action(self, i: int, text: str) -> ParsedAction:
        return self.pool.parse_action(text)

    def step(self, actions: dict[int, str]) -> dict[int, Any]:
        return self.collect(self.submit(actions))

    def submit(self, actions: dict[int, str]):
        """Send the actions to their workers and return at once (:meth:`interq.envs.pool.BatchPool.step_submit`)."""
        import time

        t0 = time.perf_counter()
        ticket = self.pool.step_submit([actions.get(i) for i in range(self.pool.num_envs)])
        self.seconds += time.perf_counter() - t0
        return ticket, list(actions)

    def collect(self, ticket) -> dict[int, Any]:
        """Wait for a :meth:`submit`'s results ({episode: StepResult}); the time spent waiting counts as env time."""
        import time

        t0 = time.perf_counter()
        pool_ticket, episodes = ticket
        res = self.pool.step_collect(pool_ticket)
        self.seconds += time.perf_counter() - t0
        return {i: res[i] for i in episodes}

    def end(self) -> None:
        pass  # a slot still running an episode (cut by max_turns) is reset by the next wave


def play_episodes(
    engine,
    chat_format,
    make_env: Callable[[], Any] | None,
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
    envs: InProcessEnvs | PooledEnvs | None = None,
    overlap: bool = False,
) -> list[Episode]:
    """Play ``len(tasks)`` episodes (episode i: ``tasks[i]``, sampling seed ``seeds[i]``) to the end.

    ``action_by_index``: the agent answers with the number of an action in the observation's admissible list
    (rendered numbered); anything else is an unparseable action (penalty, passed on as-is).
    ``envs``: where the environments run (module docstring); default ``InProcessEnvs(make_env)``. Episodes are
    played in waves of ``envs.capacity`` (all at once in-process).
    ``overlap``: play each wave in two halves, one generating while the other's environments step (module
    docstring); the same episodes as without it (sampling is per episode), generation at half the batch.
    """
    if not (len(tasks) == len(seeds) == len(groups)):
        raise ValueError(f"tasks, seeds and groups must have the same length, got {len(tasks)}, {len(seeds)}, {len(groups)}")
    if layout not in ("concatenated", "per_turn"):
        raise ValueError(f"layout={layout!r}; accepted: 'concatenated', 'per_turn'")
    if envs is None:
        if make_env is None:
            raise ValueError("play_episodes needs make_env or envs")
        envs = InProcessEnvs(make_env)
    episodes = [Episode(task=t, group=int(g), seed=int(s)) for t, s, g in zip(tasks, seeds, groups)]
    wave = envs.capacity or max(len(episodes), 1)
    for w0 in range(0, len(episodes), wave):
        _play_wave(engine, chat_format, envs, episodes[w0: w0 + wave], sampling, max_turns, invalid_action_penalty,
                   layout, history_turns, render, action_by_index, overlap)
    return episodes


def _play_wave(engine, fmt, envs, episodes, sampling, max_turns, penalty, layout, window, render, by_index,
               overlap=False) -> None:
    history: list[list[tuple[str, str]]] = [[] for _ in episodes]
    try:
        current = envs.reset([ep.task for ep in episodes])
        n = len(episodes)
        halves = [list(range(n // 2)), list(range(n // 2, n))] if overlap and n >= 2 else [list(range(n))]
        if layout == "concatenated":
            lanes = [_concatenated_lane(engine, fmt, episodes, idx, current, history, sampling, render)
                     for idx in halves]
        else:
            lanes = [_per_turn_lane(engine, fmt, episodes, idx, current, history, sampling, window, render)
                     for idx in halves]
        _drive(lanes, envs, episodes, current, history, penalty, by_index, max_turns)
    finally:
        envs.end()


def _drive(lanes, envs, episodes, current, history, penalty, by_index, max_turns) -> None:
    """Run the lanes to their ends. A lane generates a turn's actions ({episode: text}), yields them, and is sent
    back {episode: done} once they were stepped. With one lane: generate, step, repeat. With two: a lane's steps
    are submitted and the other lane generates while they run; its results are collected just before it
    generates again (a ping-pong pipeline: the environments of one half overlap the generation of the other)."""
    queue = []  # (lane, parsed actions, ticket), in submit order
    try:
        for lane in lanes:
            _advance(lane, None, envs, current, by_index, queue)
        while queue:
            lane, parsed, ticket = queue[0]
            done_of = _record(episodes, current, history, parsed, envs.collect(ticket), penalty, max_turns)
            queue.pop(0)
            _advance(lane, done_of, envs, current, by_index, queue)
    finally:  # an error left steps out in the workers: take their answers, so the pool can be reset and used again
        for _, _, ticket in queue:
            try:
                envs.collect(ticket)
            except Exception:  # noqa: BLE001 - the original error is the one to report
                pass


def _advance(lane, done_of, envs, current, by_index, queue) -> None:
    """Send ``done_of`` to the lane, which generates its next actions; parse and submit them (or finish)."""
    try:
        texts = next(lane) if done_of is None else lane.send(done_of)
    except StopIteration:
        return
    parsed = {i: parse_index(text, current[i].admissible_actions) if by_index else envs.parse_action(i, text)
              for i, text in texts.items()}
    queue.append((lane, parsed, envs.submit({i: p.action for i, p in parsed.items()})))


def parse_index(text: str, admissible: Sequence[str] | None) -> ParsedAction:
    """``"3"`` -> the 3rd admissible action; anything else is unparseable (passed on as-is)."""
    s = text.strip()
    if admissible and s.isdigit() and 1 <= int(s) <= len(admissible):
        return ParsedAction(admissible[int(s) - 1], True)
    return ParsedAction(s, False)


def _record(episodes, current, history, parsed: dict[int, ParsedAction], results: dict[int, Any], penalty: float,
            max_turns: int) -> dict[int, bool]:
    """Record the stepped actions' reward, anchor and history, advance ``current``, enforce the turn limit; return
    {episode: done} (both layouts share this)."""
    done_of = {}
    for i, p in parsed.items():
        ep, obs, result = episodes[i], current[i], results[i]
        ep.anchors.append(obs.anchor or obs.text)
        ep.actions.append(p.action)
        failure = result.info.get("failure")
        valid = bool(p.valid and result.info.get("valid_action", True))
        ep.valid.append(valid)
        if failure:  # the worker crashed or hung: the episode ends here, failed (not the policy's doing)
            ep.failed = str(failure)
            ep.rewards.append(0.0)
        else:
            ep.rewards.append(float(result.reward) - (0.0 if p.valid else penalty))
        if result.info.get("won"):
            ep.won = True
        ep.terminated = bool(result.terminated)
        ep.truncated = bool(result.truncated)
        done = bool(result.terminated or result.truncated)
        history[i].append((obs.text, ep.actions[-1]))
        current[i] = result.observation
        if not done and ep.num_turns >= max_turns:
            ep.truncated, done = True, True
        done_of[i] = done
    return done_of


def _concatenated_lane(engine, fmt, episodes, idx, current, history, sampling, render):
    """The concatenated layout for the episodes ``idx`` (one engine session each, for its whole life): a generator
    yielding each turn's {episode: action text} and sent {episode: done} (:func:`_drive`)."""
    batch = engine.new_batch(seeds=[episodes[i].seed for i in idx], sampling=sampling)
    chats = [fmt.start() for _ in idx]
    obs_ids = {j: chats[j].observation(render(episodes[i].task, current[i], 0, [], None)) for j, i in enumerate(idx)}
    turn = 0
    while obs_ids:
        out = batch.step(obs_ids)
        obs_ids = {}
        texts = {}
        for j, r in out.items():
            ep = episodes[idx[j]]
            text = chats[j].action(r.action_ids)
            if r.truncated:  # context limit: the engine has already closed the episode
                ep.truncated = ep.context_truncated = True
                continue
            texts[idx[j]] = text
        done_of = (yield texts) if texts else {}
        finished = []
        for j, i in enumerate(idx):
            if i not in done_of:
                continue
            if done_of[i]:
                finished.append(j)
            else:
                obs_ids[j] = chats[j].observation(render(episodes[i].task, current[i], turn + 1, history[i], None))
        batch.finish_many(finished)  # the episodes that ended this turn leave the cache in one pass
        turn += 1
    for j, i in enumerate(idx):
        episodes[i].rows = [batch.trajectory(j)]


def _per_turn_lane(engine, fmt, episodes, idx, current, history, sampling, window, render):
    """The per-turn layout for the episodes ``idx`` (a fresh one-turn session per episode and turn), as a lane of
    :func:`_drive`."""
    live = list(idx)
    turn = 0
    while live:
        # one fresh session per (episode, turn); the seed mixes the episode seed and the turn
        batch = engine.new_batch(seeds=[episodes[i].seed * 1009 + turn for i in live], sampling=sampling)
        chats = [fmt.start() for _ in live]
        obs_ids = {j: chats[j].observation(render(episodes[i].task, current[i], turn, history[i], window))
                   for j, i in enumerate(live)}
        out = batch.step(obs_ids)
        rows = batch.finish_many(range(len(live)))  # the session's rows leave the cache in one pass
        texts = {}
        for j, i in enumerate(live):
            ep, r = episodes[i], out[j]
            text = chats[j].action(r.action_ids)
            ep.rows.append(rows[j])
            if r.truncated:
                ep.truncated = ep.context_truncated = True
                ep.rows.pop()  # a prompt that did not fit has no action to train on
                continue
            texts[i] = text
        done = (yield texts) if texts else {}
        live = [i for i in live if i in done and not done[i]]
        turn += 1
