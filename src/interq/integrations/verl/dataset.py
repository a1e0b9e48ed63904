"""Dataset rows (parquet) for verl's trainer, one per task of an interq environment's split.

    python -m interq.integrations.verl.dataset --env household --split train --out data/household_train.parquet
    python -m interq.integrations.verl.dataset --env alfworld --split valid_unseen --out data/alf_val.parquet \\
        --max-turns 50 --num-tasks 128

Each row is what verl's ``RLHFDataset`` reads and the ``interq_env`` agent loop
(:mod:`interq.integrations.verl.agent_loop`) plays:

- ``agent_name``: ``interq_env`` (so the row runs in interq's loop whatever ``default_agent_loop`` is);
- ``prompt``: one user message with the task's description (verl needs a prompt column; the loop renders the
  real first observation from the environment);
- ``data_source``: ``interq/<env>``; ``ability``: ``agent``; ``reward_model``: ``{"style": "interq_env"}`` (the
  reward is the environment's, set by the loop);
- ``extra_info``: the episode: ``env``, ``split``, ``task_id``, ``task_type``, ``description``, ``env_kwargs``
  (a JSON string), ``max_turns``, ``invalid_action_penalty``, ``prompt`` (``verl_agent`` | ``compact``),
  ``action_format`` (``text`` | ``index``), ``show_admissible``, ``max_action_tokens``, ``index``.

Bad arguments stop the command before any row is written, with the flag and the accepted values.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from interq.integrations.verl.env_loop import ACTION_FORMATS, PROMPTS, EnvLoopError, settings_from_extra_info

AGENT_NAME = "interq_env"  # the agent loop's registered name (agent_loop.AGENT_NAME; not imported: that imports verl)


def build_rows(env: str, split: str, *, env_kwargs: dict | None = None, num_tasks: int = 0, max_turns: int = 50,
               invalid_action_penalty: float = 0.1, prompt: str = "verl_agent", action_format: str = "text",
               show_admissible: bool = True, max_action_tokens: int = 0) -> list[dict[str, Any]]:
    """The rows of ``env``'s ``split`` (its first ``num_tasks`` tasks; 0: all). Raises ``EnvLoopError`` on bad input."""
    from interq.envs import UnknownEnvError, list_envs, make_env

    if env not in list_envs():
        raise EnvLoopError(f"--env {env!r} is not an interq environment; accepted: {', '.join(list_envs())}")
    if num_tasks < 0:
        raise EnvLoopError(f"--num-tasks must be >= 0 (0: the whole split), got {num_tasks}")
    env_kwargs = dict(env_kwargs or {})
    try:
        e = make_env(env, **env_kwargs)
    except UnknownEnvError as err:
        raise EnvLoopError(f"--env {env!r}: {err}") from err
    except TypeError as err:
        raise EnvLoopError(f"--env-kwargs {json.dumps(env_kwargs)}: {err}") from err
    try:
        try:
            tasks = list(e.tasks(split))
        except ValueError as err:  # the environment names its splits
            raise EnvLoopError(f"--split {split!r}: {err}") from err
    finally:
        e.close()
    if num_tasks:
        tasks = tasks[:num_tasks]
    if not tasks:
        raise EnvLoopError(f"--split {split!r} of {env!r} has no tasks")
    rows = []
    for i, t in enumerate(tasks):
        extra = {
            "env": env, "split": split, "task_id": t.task_id, "task_type": t.task_type or "",
            "description": t.description or "", "env_kwargs": json.dumps(env_kwargs, sort_keys=True),
            "max_turns": int(max_turns), "invalid_action_penalty": float(invalid_action_penalty), "prompt": prompt,
            "action_format": action_format, "show_admissible": bool(show_admissible),
            "max_action_tokens": int(max_action_tokens), "index": i,
        }
        settings_from_extra_info(extra)  # the loop's own check: a bad value stops here, before any row is written
        rows.append({
            "data_source": f"interq/{env}",
            "agent_name": AGENT_NAME,
            "prompt": [{"role": "user", "content": t.description or f"{env} task {t.task_id}"}],
            "ability": "agent",
            "reward_model": {"style": "interq_env", "ground_truth": ""},
            "extra_info": extra,
        })
    return rows


def write_parquet(rows: list[dict[str, Any]], out: str | Path) -> Path:
    """Write ``rows`` to ``out`` (parquet, through pandas + pyarrow, which verl installs)."""
    try:
        import pandas as pd
    except ImportError as e:  # pragma: no cover - verl depends on pandas / pyarrow
        raise EnvLoopError(f"writing parquet needs pandas and pyarrow (installed with interq[verl]): {e}") from e
    out = Path(out)
    if out.suffix != ".parquet":
        raise EnvLoopError(f"--out {str(out)!r} must end in .parquet")
    out.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_parquet(out, index=False)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m interq.integrations.verl.dataset", description=__doc__.split("\n")[0])
    p.add_argument("--env", required=True, help="interq environment (household, alfworld, scienceworld, synthshop, webshop)")
    p.add_argument("--split", required=True, help="the environment's split, e.g. train, valid_seen, valid_unseen, test")
    p.add_argument("--out", required=True, help="output .parquet file")
    p.add_argument("--num-tasks", type=int, default=0, help="first N tasks of the split (0: all)")
    p.add_argument("--env-kwargs", default="{}", help="JSON object of make_env keyword arguments")
    p.add_argument("--max-turns", type=int, default=50, help="environment steps per episode")
    p.add_argument("--invalid-action-penalty", type=float, default=0.1)
    p.add_argument("--prompt", default="verl_agent", choices=[x for x in PROMPTS if x != "auto"])
    p.add_argument("--action-format", default="text", choices=list(ACTION_FORMATS))
    p.add_argument("--hide-admissible", action="store_true", help="leave the admissible actions out of observations")
    p.add_argument("--max-action-tokens", type=int, default=0, help="per-turn generation limit (0: response budget only)")
    a = p.parse_args(argv)
    try:
        env_kwargs = json.loads(a.env_kwargs)
        if not isinstance(env_kwargs, dict):
            raise ValueError("not an object")
    except ValueError as e:
        print(f"error: --env-kwargs must be a JSON object, got {a.env_kwargs!r} ({e})", file=sys.stderr)
        return 2
    try:
        rows = build_rows(a.env, a.split, env_kwargs=env_kwargs, num_tasks=a.num_tasks, max_turns=a.max_turns,
                          invalid_action_penalty=a.invalid_action_penalty, prompt=a.prompt,
                          action_format=a.action_format, show_admissible=not a.hide_admissible,
                          max_action_tokens=a.max_action_tokens)
        out = write_parquet(rows, a.out)
    except EnvLoopError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {len(rows)} rows of {a.env}/{a.split} to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
