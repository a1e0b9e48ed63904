"""What a household policy decides where it matters: teacher-forced along the expert's path on held-out tasks, the
policy's distribution over the numbered admissible actions at every turn, grouped by the kind of decision.

    .venv/bin/python scripts/household_decisions.py POLICY_DIR [--setting study] [--tasks 60] [key.sub=value ...]

The settings (``--setting``, as in ``interq compare``; default ``study``) and the overrides give the environment, its
held-out split and the prompt; the policy answers with the number of an admissible action (``env.action_format=index``).
Each candidate answer ``k<stop>`` is scored by the policy at temperature 1 and the scores are normalised over the
candidates. Kinds of decision, by the expert's action and what the list holds:

- ``take goal``: a ``take <goal object>`` entry is listed and the expert takes it;
- ``leave distractors``: ``take`` entries are listed, none of the goal object, nothing held: the expert walks on;
- ``place``: the expert moves the held goal object into the goal receptacle;
- ``carry on``: holding the goal object away from the goal receptacle (a ``move`` entry is listed): the expert walks on;
- ``open`` and ``go to``: the other turns.

Per kind: decisions, mean p(expert action), share where the expert action is the argmax, and mean p(the error that
matters there): taking a wrong object (``take goal``, ``leave distractors``), putting the object down in the wrong
place (``carry on``). Ends with ``RESULT {json}``.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys

import torch

from interq.agent.loop import make_render
from interq.train.build import chat_format, env_factory, split_tasks
from interq.train.config import build_config
from interq.train.experiments import SETTINGS
from interq.train.policy import load_policy


def decision_kind(goal: str, goal_receptacle: str, admissible: list[str], expert: str, holding: bool) -> str:
    takes = [a for a in admissible if a.startswith("take ")]
    if expert.startswith("take ") and expert.split(" ")[1] == goal:
        return "take goal"
    if takes and not holding:
        return "leave distractors"
    if expert.startswith("move "):
        return "place" if expert.split(" to ")[-1].startswith(goal_receptacle) else "other"
    if holding and any(a.startswith("move ") for a in admissible):
        return "carry on"
    for kind in ("open", "go to"):
        if expert.startswith(kind + " "):
            return kind
    return "other"


def error_mass(kind: str, goal: str, admissible: list[str], probs: list[float]) -> float:
    if kind in ("take goal", "leave distractors"):
        return sum(p for a, p in zip(admissible, probs) if a.startswith("take ") and a.split(" ")[1] != goal)
    if kind == "carry on":
        return sum(p for a, p in zip(admissible, probs) if a.startswith("move "))
    return float("nan")


@torch.no_grad()
def candidate_probs(model, fmt, tokenizer, prompt: list[int], n: int) -> list[float]:
    """p(answer k) for k = 1..n, normalised over the n candidates (each answer is its number and the stop token)."""
    stop = fmt.stop_token_ids[0]
    answers = [list(tokenizer(str(k), add_special_tokens=False)["input_ids"]) + [stop] for k in range(1, n + 1)]
    width = len(prompt) + max(len(a) for a in answers)
    ids = torch.full((n, width), fmt.pad_token_id, dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.long)
    for i, a in enumerate(answers):
        row = prompt + a
        ids[i, :len(row)] = torch.tensor(row)
        mask[i, :len(row)] = 1
    logp = torch.log_softmax(model(input_ids=ids, attention_mask=mask).logits.float(), dim=-1)
    scores = torch.stack([sum(logp[i, len(prompt) - 1 + j, tok] for j, tok in enumerate(a)) for i, a in enumerate(answers)])
    return torch.softmax(scores, dim=0).tolist()


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="household_decisions", description=__doc__.split("\n\n")[0])
    p.add_argument("policy")
    p.add_argument("--setting", default="study", choices=sorted(SETTINGS))
    p.add_argument("--tasks", type=int, default=60, help="held-out tasks to follow (the first N of the split)")
    p.add_argument("overrides", nargs="*")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    cfg = build_config("household", [*SETTINGS[args.setting], *args.overrides])
    if cfg.env.action_format != "index":
        p.error(f"env.action_format={cfg.env.action_format!r}: this diagnostic scores numbered answers (index)")
    make_env = env_factory(cfg.env)
    _, tasks = split_tasks(make_env, cfg.env)
    model, tokenizer = load_policy(args.policy, "float32")
    model.eval()
    fmt = chat_format(tokenizer)
    render = make_render(True, True)
    window = cfg.rollout.history_turns if cfg.algo.layout == "per_turn" else None
    if window is None:
        p.error("algo.layout=concatenated: this diagnostic renders per-turn prompts")
    stats: dict[str, list[tuple[float, bool, float]]] = collections.defaultdict(list)
    env = make_env()
    for task in tasks[:args.tasks]:
        goal = task.description.split(" ")[2]  # "put a(n)/some <object> in/on <receptacle>."
        goal_receptacle = task.description.rstrip(".").split(" ")[-1]
        obs, hist, holding = env.reset(task), [], False
        for t in range(cfg.env.max_turns):
            adm, expert = list(obs.admissible_actions or ()), env.expert_action()
            if expert is None or expert not in adm:
                break
            prompt = fmt.start().observation(render(task, obs, t, hist, window))
            probs = candidate_probs(model, fmt, tokenizer, prompt, len(adm))
            kind = decision_kind(goal, goal_receptacle, adm, expert, holding)
            k = adm.index(expert)
            stats[kind].append((probs[k], max(range(len(adm)), key=probs.__getitem__) == k,
                                error_mass(kind, goal, adm, probs)))
            holding = holding or (expert.startswith("take ") and expert.split(" ")[1] == goal)
            res = env.step(expert)
            hist.append((obs.text, expert))
            obs = res.observation
            if res.terminated or res.truncated:
                break
    env.close()
    rows = {}
    print(f"policy {args.policy}: {min(args.tasks, len(tasks))} held-out tasks of {cfg.env.eval_split}, teacher-forced on "
          f"the expert's path\n")
    print("| decision | n | p(expert action) | expert is argmax | p(error) |\n|---|---|---|---|---|")
    for kind in ("go to", "open", "leave distractors", "take goal", "carry on", "place", "other"):
        if kind not in stats:
            continue
        xs = stats[kind]
        errs = [e for _, _, e in xs if e == e]
        rows[kind] = {"n": len(xs), "p_expert": sum(x for x, _, _ in xs) / len(xs),
                      "argmax": sum(a for _, a, _ in xs) / len(xs),
                      "p_error": sum(errs) / len(errs) if errs else None}
        r = rows[kind]
        err = "" if r["p_error"] is None else f"{r['p_error']:.3f}"
        print(f"| {kind} | {r['n']} | {r['p_expert']:.3f} | {r['argmax']:.3f} | {err} |")
    print("RESULT " + json.dumps({"policy": args.policy, "tasks": min(args.tasks, len(tasks)), "decisions": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
