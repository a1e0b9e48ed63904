"""interq's environments as a verl agent loop: ``agent_name`` :data:`AGENT_NAME` (``interq_env``).

The plugin registers :class:`InterqEnvAgentLoop` in verl's agent-loop registry when a process imports
``verl.experimental.agent_loop.agent_loop`` (verl's own ``@register``), so rows whose ``agent_name`` is
``interq_env`` (or ``actor_rollout_ref.rollout.agent.default_agent_loop=interq_env``) run here. This module
imports verl: it is imported by verl's agent-loop workers (hydra instantiates the class by name), never by
``import interq``.

Each row is one episode (:func:`interq.integrations.verl.env_loop.run_env_episode`):

- the environment is ``interq.envs.make_env(extra_info.env, **extra_info.env_kwargs)`` reset on the task named
  by ``extra_info`` (rows written by ``python -m interq.integrations.verl.dataset``);
- model turns go through verl's server manager (``self.server_manager.generate``, sticky per episode so the
  server's prefix cache holds the conversation), with ``max_tokens`` = what is left of
  ``rollout.response_length`` (and at most ``extra_info.max_action_tokens``) and the chat format's stop tokens;
- the observations are the chat template's incremental rendering (:mod:`interq.rollout.chat`, the same token
  stream interq's own agent loop builds), merged so that ``response_mask`` (1 on trained action tokens) and
  ``response_logprobs`` (the server's, 0 on observations) stay aligned with ``response_ids``;
- ``reward_score`` is the episode return (the environment's rewards, the invalid-action penalty included), which
  verl puts on the last response token (``rm_scores``); ``turn_scores`` are the per-step rewards;
- ``extra_fields``: ``interq_traj_uid`` (one id per trajectory), ``interq_turn_spans`` (the trained actions'
  response offsets, the turns the InterQ correction reads), ``interq_won``, ``interq_num_turns``,
  ``interq_context_truncated`` and the environment's name and task.

An episode cut by ``response_length`` is logged (once per process, with the numbers and what to change): its
last action, never sent to the environment, is not trained.
"""

from __future__ import annotations

import logging
import os
import uuid
from typing import Any

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput, register

from interq.integrations.verl.env_loop import (
    EnvLoopError,
    make_episode_render,
    run_env_episode,
    settings_from_extra_info,
)

AGENT_NAME = "interq_env"
logger = logging.getLogger("interq.integrations.verl")
logger.setLevel(os.environ.get("INTERQ_VERL_LOG_LEVEL", "INFO").upper())

_WARNED: set[str] = set()


def chat_format_for(tokenizer: Any, kind: str = "auto", stop_tokens: list[str] | None = None):
    """interq's chat format for verl's tokenizer: the tokenizer's chat template (``hf``), or interq's minimal
    format for a tokenizer holding its special tokens (``minimal``); ``auto`` picks ``hf`` when there is a template.
    ``stop_tokens`` (``hf``): the end-of-turn tokens that end an action (default: the tokenizer's ``eos_token``)."""
    from interq.rollout.chat import HFChatFormat, MinimalChatFormat

    if kind not in ("auto", "hf", "minimal"):
        raise EnvLoopError(f"chat_format={kind!r} is not accepted; accepted: auto, hf, minimal")
    if kind == "hf" or (kind == "auto" and getattr(tokenizer, "chat_template", None)):
        try:
            return HFChatFormat(tokenizer, stop_tokens=list(stop_tokens) if stop_tokens else None)
        except ValueError as e:
            raise EnvLoopError(f"interq_env agent loop, stop_tokens={stop_tokens!r}: {e}") from e
    return MinimalChatFormat(tokenizer)


def _warn_once(key: str, msg: str, *args) -> None:
    if key not in _WARNED:
        _WARNED.add(key)
        logger.warning(msg, *args)


@register(AGENT_NAME)
class InterqEnvAgentLoop(AgentLoopBase):
    """One interq environment episode per row (module docstring). ``chat_format`` and ``stop_tokens``: see
    :func:`chat_format_for` (settable from an agent-loop config file entry, ``agent_loop_config_path``, e.g.
    ``stop_tokens: ["<|im_end|>"]`` for a tokenizer whose ``eos_token`` is not the end-of-turn token)."""

    def __init__(self, *args, chat_format: str = "auto", stop_tokens: list[str] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.response_length = int(self.rollout_config.response_length)
        self.prompt_length = int(self.rollout_config.prompt_length)
        self.chat_format = chat_format_for(self.tokenizer, chat_format, stop_tokens)

    async def run(self, sampling_params: dict[str, Any], **kwargs) -> AgentLoopOutput:
        from interq.envs import make_env

        settings = settings_from_extra_info(kwargs.get("extra_info"))
        request_id = uuid.uuid4().hex
        stop_ids = sorted(set(int(t) for t in self.chat_format.stop_token_ids)
                          | set(sampling_params.get("stop_token_ids") or []))
        turns = {"n": 0}

        async def generate(prompt_ids: list[int], max_tokens: int):
            if turns["n"] == 0 and len(prompt_ids) > self.prompt_length:
                raise EnvLoopError(
                    f"env {settings.env!r} task {settings.task_id!r}: the first observation is {len(prompt_ids)} "
                    f"tokens, more than actor_rollout_ref.rollout.prompt_length={self.prompt_length}; raise it "
                    "(verl pads every prompt to that length)")
            turns["n"] += 1
            params = {**sampling_params, "max_tokens": int(max_tokens), "stop_token_ids": stop_ids}
            out = await self.server_manager.generate(request_id=request_id, prompt_ids=prompt_ids,
                                                     sampling_params=params)
            lps = out.log_probs if out.log_probs is not None else []
            if sampling_params.get("logprobs") and len(lps) != len(out.token_ids):
                raise EnvLoopError("the rollout server returned no log-probs for an interq episode; set "
                                   "actor_rollout_ref.rollout.calculate_log_probs=true")
            return out.token_ids, (lps if lps else [0.0] * len(out.token_ids))

        env = await self.loop.run_in_executor(None, lambda: make_env(settings.env, **settings.env_kwargs))
        try:
            row = await run_env_episode(generate, env, settings, self.chat_format,
                                        response_length=self.response_length, render=make_episode_render(settings),
                                        run_blocking=lambda fn: self.loop.run_in_executor(None, fn))
        finally:
            try:
                env.close()
            except Exception:  # noqa: BLE001 - closing must not hide the episode's own error
                pass
        if row.context_truncated:
            _warn_once("context", "interq_env: an episode of %r (task %s) was cut by "
                       "actor_rollout_ref.rollout.response_length=%d after %d environment steps: its last action "
                       "was never sent to the environment and is not trained (response_mask 0). Raise "
                       "response_length or lower extra_info.max_turns (logged once per process)",
                       settings.env, settings.task_id, self.response_length, row.num_turns)
        extra = {
            "turn_scores": list(row.rewards),
            "interq_traj_uid": request_id,
            "interq_turn_spans": [list(s) for s in row.turn_spans],
            "interq_env": settings.env,
            "interq_task_id": settings.task_id,
            "interq_won": bool(row.won),
            "interq_num_turns": int(row.num_turns),
            "interq_context_truncated": bool(row.context_truncated),
        }
        return AgentLoopOutput(
            prompt_ids=row.prompt_ids,
            response_ids=row.response_ids,
            response_mask=row.response_mask,
            response_logprobs=row.response_logprobs if sampling_params.get("logprobs") else None,
            reward_score=row.episode_return,
            num_turns=2 * row.num_turns + 1,
            metrics=AgentLoopMetrics(),
            extra_fields=extra,
        )
