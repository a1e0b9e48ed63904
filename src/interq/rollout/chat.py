"""Chat formats: turn environment text into the token chunks the engine prefills, one turn at a time.

The engine core knows token ids only; a chat format lives outside it and renders *incrementally*: the
observation chunk of turn t is exactly the tokens that rendering the whole conversation would add after the
action of turn t-1, so the concatenation of chunks and sampled actions equals the full rendering (tested).

Two formats share one small interface (``start() -> session``; ``session.observation(text) -> ids``;
``session.action(action_ids) -> text``; ``stop_token_ids``; ``pad_token_id``):

* :class:`MinimalChatFormat` for a small custom tokenizer (the tiny policy's). Special tokens, exported as
  :data:`MINIMAL_SPECIAL_TOKENS` so the tokenizer trainer registers them:

  ``<|pad|>``  padding (never attended to)
  ``<|obs|>``  opens an observation (environment text)
  ``<|act|>``  closes the observation and opens the agent's action (the generation prompt)
  ``<|end|>``  closes the action; the stop token the policy learns to sample

  A conversation reads ``[system text]<|obs|>obs 0<|act|>action 0<|end|><|obs|>obs 1<|act|>action 1<|end|>...``.
  When an action is cut by the per-turn limit (no ``<|end|>`` sampled), the next chunk starts with ``<|end|>``
  (an observation token, not trained) so the history stays well formed.

* :class:`HFChatFormat` for pretrained chat models: the tokenizer's own jinja chat template
  (SmolLM2-135M-Instruct via ``interq.models.pretrained.load_smollm2``). Each chunk is found by rendering the
  conversation with a sentinel as the last assistant message and taking the text after it; the template's
  quirks are kept as the template renders them: SmolLM2's default system prompt (added when the first
  message is not a system message), the generation prompt ``<|im_start|>assistant\\n``, and the end of turn
  ``<|im_end|>\\n`` (the sampled ``<|im_end|>`` is the stop token; the ``\\n`` after it belongs to the next
  chunk). A template that rewrites earlier turns (not append-only) is rejected with a clear error.
"""

from __future__ import annotations

from typing import Any, Sequence

MINIMAL_SPECIAL_TOKENS: tuple[str, ...] = ("<|pad|>", "<|obs|>", "<|act|>", "<|end|>")
PAD, OBS, ACT, END = MINIMAL_SPECIAL_TOKENS

_SENTINEL = "\ue000interq-action\ue001"


def _encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []


def _token_id(tokenizer: Any, token: str) -> int | None:
    tid = tokenizer.convert_tokens_to_ids(token)
    if tid is None or tid == getattr(tokenizer, "unk_token_id", None) and token != getattr(tokenizer, "unk_token", None):
        return None
    return int(tid)


class MinimalChatFormat:
    """The minimal format for a custom tokenizer holding :data:`MINIMAL_SPECIAL_TOKENS`."""

    def __init__(self, tokenizer: Any) -> None:
        ids = {tok: _token_id(tokenizer, tok) for tok in MINIMAL_SPECIAL_TOKENS}
        missing = [tok for tok, tid in ids.items() if tid is None]
        if missing:
            raise ValueError(
                f"tokenizer lacks the minimal chat format's special tokens {missing}; "
                f"add all of MINIMAL_SPECIAL_TOKENS = {list(MINIMAL_SPECIAL_TOKENS)} when building it"
            )
        self.tokenizer = tokenizer
        self.pad_token_id, self.obs_id, self.act_id, self.end_id = (ids[t] for t in MINIMAL_SPECIAL_TOKENS)
        self.stop_token_ids: tuple[int, ...] = (self.end_id,)

    def start(self, system: str | None = None) -> "MinimalChatSession":
        return MinimalChatSession(self, system)

    def render(self, observations: Sequence[str], actions: Sequence[Sequence[int]], system: str | None = None) -> list[int]:
        """The whole conversation at once (reference for the incremental rendering)."""
        ids = _encode(self.tokenizer, system or "")
        for t, obs in enumerate(observations):
            if t > 0 and (not actions[t - 1] or actions[t - 1][-1] != self.end_id):
                ids.append(self.end_id)
            ids += [self.obs_id, *_encode(self.tokenizer, obs), self.act_id]
            if t < len(actions):
                ids += list(actions[t])
        return ids


class MinimalChatSession:
    def __init__(self, fmt: MinimalChatFormat, system: str | None) -> None:
        self.fmt = fmt
        self._prefix = _encode(fmt.tokenizer, system or "")
        self._open_action = False  # the last action ended without <|end|>
        self._turns = 0

    def observation(self, text: str) -> list[int]:
        """Tokens to prefill before the next action: [<|end|>]<|obs|>text<|act|>."""
        f = self.fmt
        ids = self._prefix if self._turns == 0 else []
        self._prefix = []
        if self._open_action:
            ids = ids + [f.end_id]
        self._turns += 1
        self._open_action = False
        return ids + [f.obs_id, *_encode(f.tokenizer, text), f.act_id]

    def action(self, action_ids: Sequence[int]) -> str:
        """Record the sampled action; returns its text without the stop token."""
        ids = list(action_ids)
        self._open_action = not ids or ids[-1] != self.fmt.end_id
        if not self._open_action:
            ids = ids[:-1]
        return self.fmt.tokenizer.decode(ids, skip_special_tokens=False)


class HFChatFormat:
    """A transformers chat template, rendered turn by turn (observations as ``observation_role`` messages)."""

    def __init__(self, tokenizer: Any, *, observation_role: str = "user", stop_tokens: Sequence[str] | None = None) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("tokenizer has no chat_template; use MinimalChatFormat for a custom tokenizer")
        self.tokenizer = tokenizer
        self.observation_role = observation_role
        if stop_tokens is None:
            stop_tokens = [tokenizer.eos_token] if tokenizer.eos_token else []
        stop_ids = []
        for tok in stop_tokens:
            tid = _token_id(tokenizer, tok)
            if tid is None:
                raise ValueError(f"stop token {tok!r} is not in the tokenizer's vocabulary")
            stop_ids.append(tid)
        if not stop_ids:
            raise ValueError("no stop token: the tokenizer has no eos_token; pass stop_tokens=[...]")
        self.stop_tokens = tuple(stop_tokens)
        self.stop_token_ids: tuple[int, ...] = tuple(stop_ids)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stop_ids[0]
        self.pad_token_id = int(pad)

    def start(self, system: str | None = None) -> "HFChatSession":
        """``system=None`` keeps the template's default (SmolLM2 adds its own system prompt)."""
        return HFChatSession(self, system)

    def render_text(self, messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)


class HFChatSession:
    def __init__(self, fmt: HFChatFormat, system: str | None) -> None:
        self.fmt = fmt
        self.messages: list[dict[str, str]] = [{"role": "system", "content": system}] if system is not None else []
        self._rendered: str | None = None     # full render up to the last generation prompt
        self._last_action: str | None = None  # decoded text of the last action, not yet in messages
        self._stopped = False                 # the last action ended with a stop token

    def observation(self, text: str) -> list[int]:
        f = self.fmt
        if self._rendered is None:
            self.messages.append({"role": f.observation_role, "content": text})
            self._rendered = f.render_text(self.messages, add_generation_prompt=True)
            return _encode(f.tokenizer, self._rendered)
        if self._last_action is None:
            raise ValueError("HFChatSession.observation: call action(...) with the sampled action first")
        probe = self.messages + [{"role": "assistant", "content": _SENTINEL}, {"role": f.observation_role, "content": text}]
        full = f.render_text(probe, add_generation_prompt=True)
        if full.count(_SENTINEL) != 1:
            raise ValueError("chat template does not render assistant content verbatim; cannot render incrementally")
        before, after = full.split(_SENTINEL)
        if before != self._rendered:
            raise ValueError(
                "chat template is not append-only (rendering a new turn changed earlier text); "
                "incremental rendering would not match the full conversation"
            )
        if self._stopped:
            stop_text = next((s for s in f.stop_tokens if after.startswith(s)), None)
            if stop_text is not None:
                after = after[len(stop_text) :]  # the sampled stop token already closed the turn
        self.messages += [{"role": "assistant", "content": self._last_action}, {"role": f.observation_role, "content": text}]
        self._rendered = f.render_text(self.messages, add_generation_prompt=True)
        self._last_action = None
        return _encode(f.tokenizer, after)

    def action(self, action_ids: Sequence[int]) -> str:
        ids = list(action_ids)
        self._stopped = bool(ids) and ids[-1] in self.fmt.stop_token_ids
        if self._stopped:
            ids = ids[:-1]
        self._last_action = self.fmt.tokenizer.decode(ids, skip_special_tokens=False)
        return self._last_action
