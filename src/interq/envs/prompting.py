"""verl-agent-style prompts for the text environments (docs/environments.md).

Every turn's prompt carries: the task, the step count, the last few (observation, action) pairs,
the current observation, the admissible actions (where the env has them), and the instruction to
answer with the action inside ``<action>...</action>``. Pure functions, no tokenizer: the agent loop
applies the chat template.

    prompt = build_prompt(spec.description, obs.text, obs.admissible_actions,
                          history=[(o1, a1), (o2, a2)], step=2)
    target = format_action("go to fridge 1")   # "<action>go to fridge 1</action>" (SFT targets)

``make_prompt_render(env_name)`` gives the agent loop's ``render`` built on ``build_prompt`` (the trainer's
``env.prompt=verl_agent``).
"""

from __future__ import annotations

from collections.abc import Sequence

from .base import ACTION_CLOSE, ACTION_OPEN

ROLES: dict[str, str] = {
    "household": "You are an expert agent in a household, acting through text commands.",
    "alfworld": "You are an expert agent in the ALFRED embodied household environment, acting through text commands.",
    "scienceworld": "You are an expert agent in a text-based science laboratory, acting through text commands.",
    "synthshop": "You are an expert shopping agent in a text-based online shop.",
    "webshop": "You are an expert shopping agent in the WebShop online shop.",
}


def format_action(action: str) -> str:
    """The answer format the prompt asks for (and ``parse_action`` reads)."""
    return f"{ACTION_OPEN}{action}{ACTION_CLOSE}"


def _quote_list(actions: Sequence[str]) -> str:
    return "[" + ", ".join(f"'{a}'" for a in actions) + "]"


def build_prompt(
    task: str,
    observation: str,
    admissible_actions: Sequence[str] | None,
    history: Sequence[tuple[str, str]] = (),
    step: int = 0,
    history_length: int = 2,
    env_name: str = "household",
    think: bool = False,
) -> str:
    """One turn's user prompt.

    Args:
        task: the goal ("put a clean apple in fridge." or a shopping instruction).
        observation: the current observation text.
        admissible_actions: the env's admissible actions, or None where it has none.
        history: all earlier (observation, action) pairs of the episode, oldest first; the last
            ``history_length`` are shown (0 shows none).
        step: number of steps already taken (``len(history)`` normally).
        env_name: picks the opening line (ROLES); unknown names get a generic one.
        think: ask for reasoning inside ``<think>...</think>`` before the action.
    """
    if history_length < 0:
        raise ValueError(f"history_length must be >= 0; got {history_length}")
    role = ROLES.get(env_name, "You are an expert agent acting in a text environment.")
    lines = [f"{role} Your task is to: {task}"]
    shown = list(history)[-history_length:] if history_length else []
    if step > 0:
        lines.append(f"Prior to this step, you have already taken {step} step(s).")
        if shown:
            first = step - len(shown) + 1
            pairs = " ".join(f"[Observation {first + i}: '{o}', Action {first + i}: '{a}']"
                             for i, (o, a) in enumerate(shown))
            lines.append(f"Below are the most recent {len(shown)} observations and the actions you took: {pairs}")
        lines.append(f"You are now at step {step + 1} and your current observation is: {observation}")
    else:
        lines.append(f"Your current observation is: {observation}")
    if admissible_actions is not None:
        lines.append(f"Your admissible actions of the current situation are: {_quote_list(admissible_actions)}.")
    lines.append("")
    what = "one admissible action" if admissible_actions is not None else "one action"
    if think:
        lines.append("Now it's your turn to take an action. First reason step by step about the current situation "
                     f"inside <think> </think> tags. Then choose {what} and present it within "
                     "<action> </action> tags.")
    else:
        lines.append(f"Now it's your turn to take an action. Choose {what} and present it within "
                     "<action> </action> tags.")
    return "\n".join(lines)


def make_prompt_render(env_name: str = "household", show_admissible: bool = True, think: bool = False):
    """``build_prompt`` as the agent loop's ``render(task, obs, turn, history, window)`` (``interq.agent.loop``).

    ``window=k`` (per_turn layout): a fresh prompt with the last k (observation, action) pairs, as verl-agent's
    ``history_length``. ``window=None`` (concatenated layout): the earlier turns are already in the context, so
    each turn's message is the prompt without a history window (task, step count, current observation, admissible
    actions, answer format). ``show_admissible=False`` leaves the admissible list out.
    """

    def render(task, obs, turn: int, history: Sequence[tuple[str, str]], window: int | None) -> str:
        adm = obs.admissible_actions if show_admissible else None
        return build_prompt(task.description, obs.text, None if adm is None else list(adm), history=history,
                            step=turn, history_length=window or 0, env_name=env_name, think=think)

    return render
