"""One interq environment episode as one verl trajectory row (no verl import: the verl agent loop wraps it).

:func:`run_env_episode` plays one episode of any interq environment against a token-level ``generate`` callable
(verl's LLM server client in :mod:`interq.integrations.verl.agent_loop`, a scripted policy in the tests) and
returns the row verl's agent loop post-processing expects: ``prompt_ids`` (the first observation, rendered by the
chat format), ``response_ids`` (every later token: sampled actions and observation chunks, in order),
``response_mask`` (1 on the sampled tokens of actions the environment received, else 0) and
``response_logprobs`` (the server's log-prob of each sampled token, 0.0 on observation tokens), all aligned
index for index.

The episode is the one interq's own agent loop (:func:`interq.agent.loop.play_episodes`, concatenated layout)
plays with the rollout engine's context limit set to ``len(prompt_ids) + response_length``:

- the observation chunks are the chat format's incremental rendering (:mod:`interq.rollout.chat`), so the
  token stream equals the full chat-template rendering of the conversation (the newline a template writes
  after the end-of-turn token belongs to the next chunk, as in interq's loop);
- actions are parsed by the environment (``env.parse_action``) or, with ``action_by_index``, as the number of an
  admissible action; an unparseable action costs ``invalid_action_penalty`` and is sent as is;
- per-turn rewards, the ``won``/``terminated``/``truncated`` flags and the step limit ``max_turns`` follow
  :func:`interq.agent.loop._record`;
- the length budget is verl's ``rollout.response_length``: each generation asks for at most
  ``min(max_action_tokens, tokens left)``. An action cut by that budget (no stop token, budget spent) is never
  sent to the environment and is **not trained** (mask 0, as interq's ``build_batch`` drops it); a next
  observation that does not fit with room for one action token is not appended. Either way the episode ends
  ``context_truncated`` (the caller says so, once, with the setting to change).

``turn_spans`` are the trained actions' ``[start, end)`` offsets in the response: exactly the runs of 1 in
``response_mask``, which is how the InterQ correction (:mod:`interq.integrations.verl.correction`, one row per
trajectory) finds the turns of the history.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from interq.envs.base import TaskSpec

#: What ``generate(prompt_ids, max_tokens)`` returns: the sampled token ids (a stop token included when sampled)
#: and one log-prob per token.
Generated = tuple[Sequence[int], Sequence[float]]
Generate = Callable[[list[int], int], Awaitable[Generated]]

PROMPTS = ("auto", "compact", "verl_agent")
ACTION_FORMATS = ("text", "index")


class EnvLoopError(ValueError):
    """A row or setting the environment agent loop cannot run (the message names the field and accepted values)."""


@dataclass(frozen=True)
class EpisodeSettings:
    """How an episode is played; read from a dataset row's ``extra_info`` (:func:`settings_from_extra_info`).

    ``prompt``: ``verl_agent`` (:func:`interq.envs.prompting.make_prompt_render`, the answer in ``<action>`` tags:
    a chat model), ``compact`` (:func:`interq.agent.loop.make_render`), ``auto`` (= ``verl_agent``).
    ``action_format``: ``text`` (the environment parses the answer) or ``index`` (the number of an admissible action).
    ``max_action_tokens``: per-turn generation limit (0: only the response budget limits an action).
    """

    env: str
    split: str
    task_id: str
    task_type: str | None = None
    description: str = ""
    env_kwargs: dict = field(default_factory=dict)
    max_turns: int = 50
    invalid_action_penalty: float = 0.1
    prompt: str = "auto"
    action_format: str = "text"
    show_admissible: bool = True
    max_action_tokens: int = 0

    @property
    def task(self) -> TaskSpec:
        return TaskSpec(env=self.env, task_id=self.task_id, split=self.split, task_type=self.task_type,
                        description=self.description)


_INT_FIELDS = ("max_turns", "max_action_tokens")


def settings_from_extra_info(extra_info: Any) -> EpisodeSettings:
    """Check and read a row's ``extra_info`` (as :mod:`interq.integrations.verl.dataset` writes it)."""
    if hasattr(extra_info, "items") and not isinstance(extra_info, dict):
        extra_info = dict(extra_info.items())
    if not isinstance(extra_info, dict):
        raise EnvLoopError(f"extra_info must be a mapping with the episode's env, split and task_id "
                           f"(write rows with python -m interq.integrations.verl.dataset); got {type(extra_info).__name__}")
    missing = [k for k in ("env", "split", "task_id") if extra_info.get(k) in (None, "")]
    if missing:
        raise EnvLoopError(f"extra_info lacks {', '.join(missing)} (got keys {sorted(extra_info)}); rows for the "
                           "interq environment loop are written by python -m interq.integrations.verl.dataset")
    kw: dict[str, Any] = {"env": str(extra_info["env"]), "split": str(extra_info["split"]),
                          "task_id": str(extra_info["task_id"])}
    if extra_info.get("task_type") not in (None, ""):
        kw["task_type"] = str(extra_info["task_type"])
    if extra_info.get("description"):
        kw["description"] = str(extra_info["description"])
    env_kwargs = extra_info.get("env_kwargs") or {}
    if isinstance(env_kwargs, str):
        try:
            env_kwargs = json.loads(env_kwargs)
        except json.JSONDecodeError as e:
            raise EnvLoopError(f"extra_info.env_kwargs must be a JSON object, got {env_kwargs!r} ({e})") from e
    if not isinstance(env_kwargs, dict):
        raise EnvLoopError(f"extra_info.env_kwargs must be a JSON object, got {env_kwargs!r}")
    kw["env_kwargs"] = env_kwargs
    for key in _INT_FIELDS:
        if extra_info.get(key) is not None:
            v = extra_info[key]
            if isinstance(v, bool) or not float(v).is_integer() or int(v) < (1 if key == "max_turns" else 0):
                raise EnvLoopError(f"extra_info.{key} must be an integer >= {1 if key == 'max_turns' else 0}, got {v!r}")
            kw[key] = int(v)
    if extra_info.get("invalid_action_penalty") is not None:
        kw["invalid_action_penalty"] = float(extra_info["invalid_action_penalty"])
    if extra_info.get("show_admissible") is not None:
        kw["show_admissible"] = bool(extra_info["show_admissible"])
    for key, accepted in (("prompt", PROMPTS), ("action_format", ACTION_FORMATS)):
        if extra_info.get(key) is not None:
            if extra_info[key] not in accepted:
                raise EnvLoopError(f"extra_info.{key}={extra_info[key]!r} is not accepted; accepted: {', '.join(accepted)}")
            kw[key] = str(extra_info[key])
    return EpisodeSettings(**kw)


def make_episode_render(s: EpisodeSettings) -> Callable[..., str]:
    """The observation renderer of ``s.prompt`` (the same renderers interq's trainer uses)."""
    if s.prompt in ("auto", "verl_agent"):
        from interq.envs.prompting import make_prompt_render

        return make_prompt_render(s.env, s.show_admissible)
    from interq.agent.loop import make_render

    return make_render(s.show_admissible, s.action_format == "index")


@dataclass
class EpisodeRow:
    """One episode as verl's one-row-per-trajectory layout (see the module docstring)."""

    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    response_logprobs: list[float] = field(default_factory=list)
    turn_spans: list[tuple[int, int]] = field(default_factory=list)  # trained actions, response offsets
    rewards: list[float] = field(default_factory=list)   # per environment step, penalty included
    actions: list[str] = field(default_factory=list)
    valid: list[bool] = field(default_factory=list)
    won: bool = False
    terminated: bool = False
    truncated: bool = False
    context_truncated: bool = False
    failed: str = ""

    @property
    def num_turns(self) -> int:
        return len(self.rewards)

    @property
    def episode_return(self) -> float:
        return float(sum(self.rewards))

    def _append(self, ids: Sequence[int], trained: int, logprobs: Sequence[float] | None = None) -> None:
        self.response_ids.extend(int(t) for t in ids)
        self.response_mask.extend([trained] * len(ids))
        self.response_logprobs.extend([float(x) for x in logprobs] if logprobs is not None else [0.0] * len(ids))


def _parse(env, text: str, admissible, by_index: bool):
    if by_index:
        from interq.agent.loop import parse_index

        return parse_index(text, admissible)
    return env.parse_action(text)


async def run_env_episode(
    generate: Generate,
    env: Any,
    settings: EpisodeSettings,
    chat_format: Any,
    *,
    response_length: int,
    render: Callable[..., str] | None = None,
    run_blocking: Callable[[Callable[[], Any]], Awaitable[Any]] | None = None,
) -> EpisodeRow:
    """Play one episode of ``env`` (already built; closed by the caller) on ``settings.task``. See the module doc.

    ``run_blocking(fn)``: how the environment's ``reset`` / ``step`` are run (verl's loop: in a worker thread, so the
    event loop keeps serving the other episodes' generations); default: called in place."""

    async def call(fn):
        return await run_blocking(fn) if run_blocking is not None else fn()

    if response_length < 1:
        raise EnvLoopError(f"actor_rollout_ref.rollout.response_length must be >= 1, got {response_length}")
    render = render or make_episode_render(settings)
    by_index = settings.action_format == "index"
    stops = set(int(t) for t in chat_format.stop_token_ids)
    task = settings.task
    chat = chat_format.start()
    obs = await call(lambda: env.reset(task))
    row = EpisodeRow(prompt_ids=list(chat.observation(render(task, obs, 0, [], None))))
    history: list[tuple[str, str]] = []
    turn = 0
    while True:
        left = response_length - len(row.response_ids)
        n = left if settings.max_action_tokens <= 0 else min(settings.max_action_tokens, left)
        ids, lps = await generate(row.prompt_ids + row.response_ids, n)
        ids, lps = list(ids)[:n], list(lps)[:n]
        if len(lps) != len(ids):
            raise EnvLoopError(f"the rollout server returned {len(ids)} tokens but {len(lps)} log-probs; set "
                               "actor_rollout_ref.rollout.calculate_log_probs=true")
        stopped = bool(ids) and ids[-1] in stops
        start = len(row.response_ids)
        if not stopped and start + len(ids) >= response_length:
            row._append(ids, 0, lps)  # cut by the budget: never sent to the environment, not trained
            row.truncated = row.context_truncated = True
            break
        row._append(ids, 1, lps)
        if ids:
            row.turn_spans.append((start, start + len(ids)))
        text = chat.action(ids)
        parsed = _parse(env, text, obs.admissible_actions, by_index)
        result = await call(lambda: env.step(parsed.action))
        row.actions.append(parsed.action)
        row.valid.append(bool(parsed.valid and result.info.get("valid_action", True)))
        failure = result.info.get("failure")
        if failure:
            row.failed = str(failure)
            row.rewards.append(0.0)
        else:
            row.rewards.append(float(result.reward) - (0.0 if parsed.valid else settings.invalid_action_penalty))
        if result.info.get("won"):
            row.won = True
        row.terminated, row.truncated = bool(result.terminated), bool(result.truncated)
        done = row.terminated or row.truncated
        history.append((obs.text, parsed.action))
        obs = result.observation
        if not done and row.num_turns >= settings.max_turns:
            row.truncated = done = True
        if done:
            break
        turn += 1
        chunk = list(chat.observation(render(task, obs, turn, history, None)))
        if len(row.response_ids) + len(chunk) + 1 > response_length:  # no room for it and one action token
            row.truncated = row.context_truncated = True
            break
        row._append(chunk, 0)
    return row


def runs_of_ones(mask: Sequence[int]) -> list[tuple[int, int]]:
    """``[start, end)`` of every maximal run of 1 in ``mask`` (the correction's turns in one-row-per-trajectory)."""
    out, start = [], None
    for i, m in enumerate(list(mask) + [0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            out.append((start, i))
            start = None
    return out
