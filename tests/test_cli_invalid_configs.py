"""Invalid configurations through the real CLI, every config section and every command that takes overrides.

Each must exit with status 2 before any work: exactly one line on stderr, ``interq: ...``, naming the field, no
traceback, and nothing written under ``--out``.
"""

from __future__ import annotations

import pytest

from interq.cli import main

# (command, arguments, text the one stderr line must contain: the field it names)
CASES = [
    # model
    ("train", ["model.arch=gpt2"], "model.arch"),
    ("train", ["model.vocab_size=100"], "model.vocab_size"),
    ("train", ["model.num_kv_heads=3"], "model.num_kv_heads"),
    ("train", ["model.hidden_size=0"], "model.hidden_size"),
    ("train", ["model.source=/nonexistent/checkpoint"], "model.source"),
    ("sft", ["model.dtype=float16"], "model.dtype"),
    ("train", ["model.arch=qwen3_moe", "model.num_experts_per_tok=9"], "model.num_experts_per_tok"),
    ("train", ["model.bogus=1"], "bogus"),
    ("train", ["model.num_layers=two"], "model.num_layers"),
    # env
    ("train", ["env.name=nosuchenv"], "env.name"),
    ("sft", ["env.name=nosuchenv"], "env.name"),
    ("demo", ["env.name=nosuchenv"], "env.name"),
    ("compare", ["env.name=nosuchenv"], "env.name"),
    ("mismatch", ["env.name=nosuchenv"], "env.name"),
    ("train", ["env.name="], "env.name"),
    ("train", ["env.task_types=flying_saucer"], "env.task_types"),
    ("sft", ["env.task_types=flying_saucer"], "env.task_types"),
    ("demo", ["env.task_types=flying_saucer"], "env.task_types"),
    ("compare", ["env.task_types=flying_saucer"], "env.task_types"),
    ("mismatch", ["env.task_types=flying_saucer"], "env.task_types"),
    ("train", ["env.train_split=nosplit"], "env.train_split"),
    ("train", ["env.max_turns=0"], "env.max_turns"),
    ("train", ["env.action_format=json"], "env.action_format"),
    ("train", ["env.action_format=index", "env.show_admissible=false"], "env.action_format"),
    ("train", ["env.env_kwargs=[1, 2]"], "env.env_kwargs"),
    ("train", ["env.env_kwargs={no_such_kwarg: 1}"], "env.env_kwargs"),
    # warm_start
    ("sft", ["warm_start.noise=1.5"], "warm_start.noise"),
    ("sft", ["warm_start.lr=0"], "warm_start.lr"),
    ("train", ["warm_start.num_demos=0"], "warm_start.num_demos"),
    ("train", ["warm_start.enabled=maybe"], "warm_start.enabled"),
    # rollout (with the integer widths)
    ("train", ["rollout.executor=int4"], "rollout.executor"),
    ("train", ["--preset", "q-interq", "rollout.w_bits=1"], "rollout.w_bits"),
    ("train", ["--preset", "q-interq", "rollout.a_bits=9"], "rollout.a_bits"),
    ("train", ["--preset", "q-interq", "rollout.kv_bits=0"], "rollout.kv_bits"),
    ("train", ["--preset", "bf16", "rollout.w_bits=4"], "rollout.w_bits"),  # bf16 executor has no integer width
    ("train", ["--preset", "q-interq", "rollout.kv_format=fp8_tensor", "rollout.kv_bits=4"], "rollout.kv_bits"),
    ("train", ["rollout.temperature=inf"], "rollout.temperature"),
    ("train", ["rollout.top_p=0"], "rollout.top_p"),
    ("mismatch", ["rollout.max_context_tokens=8"], "rollout.max_context_tokens"),
    # algo
    ("train", ["algo.correction=magic"], "algo.correction"),
    ("train", ["algo.layout=diagonal"], "algo.layout"),
    ("train", ["algo.gigpo_omega=inf"], "algo.gigpo_omega"),
    ("train", ["--preset", "bf16", "algo.align=true"], "algo.align"),
    ("compare", ["algo.icepop_low=3"], "algo.icepop_low"),
    # optim
    ("train", ["optim.lr=inf"], "optim.lr"),
    ("train", ["optim.beta2=1.5"], "optim.beta2"),
    ("train", ["optim.grad_clip=-1"], "optim.grad_clip"),
    # train
    ("train", ["train.tasks_per_step=0"], "train.tasks_per_step"),
    ("train", ["train.episodes_per_task=1"], "train.episodes_per_task"),
    ("demo", ["train.eval_every_steps=0"], "train.eval_every_steps"),
    ("train", ["train.steps=-1"], "train.steps"),
    ("train", ["train.steps.x=1"], "train.steps"),
    # presets and override syntax
    ("train", ["--preset", "nope"], "preset"),
    ("mismatch", ["--preset", "nope"], "preset"),
    ("eval", ["--preset", "nope", "--policy", "smollm2"], "preset"),
    ("eval", ["--policy", "smollm2", "env.task_types=flying_saucer"], "env.task_types"),
    ("eval", ["--policy", "smollm2", "rollout.top_p=0"], "rollout.top_p"),
    ("train", ["--preset", "@bad_yaml"], "preset"),
    ("train", ["--preset", "@list_yaml"], "preset"),
    ("train", ["--preset", "@cycle_yaml"], "preset"),
    ("train", ["--preset", "@unknown_field_yaml"], "optim"),
    ("train", ["train.steps"], "train.steps"),
    ("train", ["train=5"], "train"),
]

PRESET_FILES = {
    "bad_yaml": "train: {steps: [1, 2\n",
    "list_yaml": "- 1\n- 2\n",
    "unknown_field_yaml": "base: bf16\noptim: {learning_rate: 0.1}\n",
}


def _args(tmp_path, command: str, args: list[str]) -> list[str]:
    files = {}
    for key, text in PRESET_FILES.items():
        files[key] = tmp_path / f"{key}.yaml"
        files[key].write_text(text)
    files["cycle_yaml"] = tmp_path / "cycle_yaml.yaml"
    files["cycle_yaml"].write_text(f"base: {files['cycle_yaml']}\n")
    args = [str(files[a[1:]]) if a.startswith("@") else a for a in args]
    if command == "demo" and "--preset" in args:
        raise AssertionError("demo has no --preset")
    return [command, "--out", str(tmp_path / "out"), *args]


def _run(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as e:
        return e.code


def test_fifty_distinct_cases_cover_every_section_and_command():
    keys = [(c, tuple(a)) for c, a, _ in CASES]
    assert len(set(keys)) == len(keys) >= 50
    text = " ".join(n for _, _, n in CASES)
    for section in ("model.", "env.", "warm_start.", "rollout.", "algo.", "optim.", "train.", "preset",
                    "rollout.w_bits", "rollout.a_bits", "rollout.kv_bits"):
        assert section in text, section
    assert {c for c, _, _ in CASES} == {"train", "sft", "eval", "demo", "compare", "mismatch"}


@pytest.mark.parametrize("command, args, field", CASES, ids=[f"{c}:{' '.join(a)}" for c, a, _ in CASES])
def test_invalid_configuration_is_one_line_naming_the_field(tmp_path, capsys, command, args, field):
    code = _run(_args(tmp_path, command, args))
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert code == 2, captured.err
    assert len(lines) == 1 and lines[0].startswith("interq: "), captured.err
    assert field in lines[0], lines[0]
    assert "Traceback" not in captured.err and captured.out == ""
    out = tmp_path / "out"
    assert not out.exists() or not any(out.iterdir()), sorted(out.rglob("*"))
