"""Run configuration: presets for the five arms, overrides, validation before any work, the field reference."""

import math
import re

import pytest

from interq.train.config import (
    ARMS, ConfigError, RunConfig, build_config, describe, load_config, parse_overrides, preset_names, save_config,
    with_overrides,
)

SPEC_ARMS = {  # the five arms: executor, aligned learner, correction
    "bf16": ("bf16", False, "tis"),
    "q-naive": ("w8a8", False, "none"),
    "q-tis": ("w8a8", False, "tis"),
    "q-align": ("w8a8", True, "tis"),
    "q-interq": ("w8a8", True, "interq"),
}


@pytest.mark.parametrize("arm", ARMS)
def test_arm_presets_match_spec_table(arm):
    cfg = build_config(arm)
    assert (cfg.rollout.executor, cfg.algo.align, cfg.algo.correction) == SPEC_ARMS[arm]
    assert cfg.name == arm
    assert arm in preset_names()


def test_quantized_arms_share_executor_config():
    qs = [build_config(a).rollout for a in ARMS if a != "bf16"]
    assert len({(r.weight_format, r.kv_format) for r in qs}) == 1


def test_overrides_parse_yaml_scalars_and_nest():
    assert parse_overrides(["train.steps=3", "algo.budget=inf", "algo.align=true", "name=x"]) == {
        "train": {"steps": 3}, "algo": {"budget": "inf", "align": True}, "name": "x"}
    assert build_config("q-interq", ["algo.budget=inf"]).algo.budget == math.inf
    cfg = build_config("q-interq", ["train.steps=3", "algo.budget=0.25", "algo.layout=per_turn", "algo.advantage=gigpo"])
    assert (cfg.train.steps, cfg.algo.budget, cfg.algo.layout, cfg.algo.advantage) == (3, 0.25, "per_turn", "gigpo")
    assert build_config("bf16", ["optim.lr=1"]).optim.lr == 1.0  # int accepted for a float field
    assert build_config("bf16", ["optim.lr=1e-3"]).optim.lr == 1e-3  # YAML 1.1 reads 1e-3 as a string


@pytest.mark.parametrize("override, needle", [
    ("algo.correction=magic", "algo.correction='magic' is not accepted; choose one of"),
    ("algo.layout=rows", "algo.layout"),
    ("algo.advantage=ppo", "algo.advantage"),
    ("train.episodes_per_task=1", "train.episodes_per_task"),
    ("train.tasks_per_step=0", "train.tasks_per_step"),
    ("train.steps=-1", "train.steps"),
    ("train.steps=many", "train.steps: expected an integer"),
    ("algo.align=maybe", "algo.align: expected true or false"),
    ("rollout.top_p=1.5", "rollout.top_p"),
    ("rollout.executor=int4", "rollout.executor"),
    ("rollout.attention=flash", "rollout.attention"),
    ("warm_start.noise=2", "warm_start.noise"),
    ("warm_start.observation_weight=-1", "warm_start.observation_weight"),
    ("model.arch=llama", "model.arch"),
    ("model.num_kv_heads=3", "model.num_kv_heads"),
    ("model.source=/nonexistent/dir", "model.source"),
    ("algo.icepop_low=3", "algo.icepop_low"),
    ("algo.budget=-0.1", "algo.budget"),
    ("algo.minibatches_per_step=1000", "algo.minibatches_per_step"),
    ("algo.colour=red", "unknown field(s) ['colour']"),
    ("nosuchsection.x=1", "unknown field(s) ['nosuchsection']"),
    ("env.action_format=json", "env.action_format"),
])
def test_invalid_values_are_rejected_naming_the_field(override, needle):
    with pytest.raises(ConfigError) as e:
        build_config("q-interq", [override])
    assert needle in str(e.value)


def test_index_actions_need_the_admissible_list():
    with pytest.raises(ConfigError, match="env.action_format='index' needs env.show_admissible=true"):
        build_config("bf16", ["env.action_format=index", "env.show_admissible=false"])


def test_align_requires_quantized_executor():
    with pytest.raises(ConfigError, match="algo.align=true needs rollout.executor='w8a8'"):
        build_config("bf16", ["algo.align=true"])


def test_unknown_preset_and_bad_override_syntax():
    with pytest.raises(ConfigError, match="unknown preset 'nope'; accepted"):
        build_config("nope")
    with pytest.raises(ConfigError, match="expected key.sub=value"):
        build_config("bf16", ["train.steps"])


def test_saved_config_round_trips(tmp_path):
    cfg = build_config("q-interq", ["train.steps=7", "algo.budget=inf"])
    save_config(cfg, tmp_path / "c.yaml")
    assert load_config(tmp_path / "c.yaml") == cfg
    assert with_overrides(cfg, ["train.steps=8"]).train.steps == 8


def test_configs_are_frozen_and_documented():
    cfg = RunConfig()
    with pytest.raises(Exception):
        cfg.train.steps = 5  # type: ignore[misc]
    names = [n for n, _, _ in describe()]
    assert "train.tasks_per_step" in names and "train.tokens_per_microbatch" in names


@pytest.mark.parametrize("preset, override, needle", [
    ("q-interq", "rollout.w_bits=1", "rollout.w_bits=1 is not accepted; it must be an integer in [2, 8]"),
    ("q-interq", "rollout.a_bits=9", "rollout.a_bits=9 is not accepted; it must be an integer in [2, 8]"),
    ("q-interq", "rollout.kv_bits=4.5", "rollout.kv_bits: expected an integer, got 4.5"),
    ("q-interq", "rollout.w_bits=true", "rollout.w_bits: expected an integer, got True"),
    ("bf16", "rollout.w_bits=4", "rollout.w_bits=4 needs rollout.executor='w8a8' (got 'bf16')"),
    ("bf16", "rollout.kv_bits=4", "rollout.kv_bits=4 needs rollout.executor='w8a8'"),
    ("q-interq", "rollout.kv_format=fp8_per_token_head,rollout.kv_bits=4",
     "rollout.kv_bits=4 needs rollout.kv_format='int8_per_token_head'"),
    ("q-interq", "rollout.weight_format=fp8_e4m3,rollout.a_bits=4", "rollout.a_bits=4 needs rollout.weight_format='int8'"),
])
def test_bit_widths_are_validated_naming_the_field(preset, override, needle):
    with pytest.raises(ConfigError) as e:
        build_config(preset, override.split(","))
    assert needle in str(e.value)


def test_bit_widths_reach_the_executor_quant_config():
    from interq.quant import QuantConfig
    from interq.train.build import quant_config

    assert quant_config(build_config("q-interq").rollout) == QuantConfig()  # defaults: W8A8-KV8, as before
    cfg = build_config("q-interq", ["rollout.w_bits=4", "rollout.a_bits=4", "rollout.kv_bits=4"])
    assert quant_config(cfg.rollout) == QuantConfig(w_bits=4, a_bits=4, kv_bits=4)
    assert build_config("q-interq", ["rollout.w_bits=5.0"]).rollout.w_bits == 5  # an integral YAML float is an int
    names = [n for n, _, _ in describe()]
    assert {"rollout.w_bits", "rollout.a_bits", "rollout.kv_bits"} <= set(names)


@pytest.mark.parametrize("override, field", [
    ("optim.lr=inf", "optim.lr"), ("rollout.temperature=inf", "rollout.temperature"),
    ("algo.gigpo_omega=inf", "algo.gigpo_omega"), ("train.eval_temperature=.inf", "train.eval_temperature"),
    ("optim.lr=nan", "optim.lr"), ("optim.max_nonfinite_steps=0", "optim.max_nonfinite_steps"),
    ("env.invalid_action_penalty=inf", "env.invalid_action_penalty"),
])
def test_infinite_or_nan_values_are_rejected_before_any_work(override, field):
    from interq.train.config import ConfigError, build_config

    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        build_config("q-interq", [override])


def test_caps_and_budget_may_be_infinite():
    from interq.train.config import build_config

    cfg = build_config("q-interq", ["algo.budget=inf", "algo.tis_cap=inf", "algo.prefix_cap=inf"])
    assert cfg.algo.budget == float("inf")


# ---------------------------------------------------------------------------------------------- field reference

HISTORY = re.compile(r"\b(session|issue|item|round|since|used to|was|were|NUMERICS_VERSION|spec)\b", re.I)


def test_every_field_has_a_short_present_tense_doc():
    from interq.train.config import field_reference

    recs = field_reference()
    assert len(recs) == len(describe()) >= 90
    for r in recs:
        doc = r["doc"]
        assert doc and doc[0].isupper() and doc.endswith("."), r["name"]
        assert len(doc) <= 400, (r["name"], len(doc))
        assert not HISTORY.search(doc), (r["name"], doc)  # what it does, not how it came to be
        assert r["allowed"], r["name"]  # every field says what it accepts


def test_an_invalid_choice_is_refused_with_the_metadatas_choices():
    """One source: the message of validate() lists exactly the allowed values of the field's metadata."""
    from interq.train.config import choices, field_reference

    with_choices = [r["name"] for r in field_reference() if r["allowed"] and "," in r["allowed"] and r["type"] == "str"
                    and _has_choices(r["name"])]
    assert {"algo.correction", "rollout.executor", "rollout.kv_format", "train.device", "env.prompt"} <= set(with_choices)
    for name in with_choices:
        with pytest.raises(ConfigError) as e:
            build_config(None, [f"{name}=__nope__"])
        assert str(e.value) == f"{name}='__nope__' is not accepted; choose one of {list(choices(name))}"


def _has_choices(name: str) -> bool:
    from interq.train.config import field_metadata

    return "choices" in field_metadata(name)


def _outside(bounds):
    """A value just outside ``bounds``: the open low end, or one unit below / above a closed end."""
    if math.isfinite(bounds.low):
        return bounds.low if bounds.low_open else bounds.low - 1
    return bounds.high + 1


def test_a_value_out_of_bounds_is_refused_with_the_metadatas_bounds():
    from interq.train.config import field_metadata, field_reference

    needs = {"model.num_experts": ["model.arch=qwen3_moe"], "model.moe_intermediate_size": ["model.arch=qwen3_moe"]}
    checked = 0
    for r in field_reference():
        bounds = field_metadata(r["name"]).get("bounds")
        if bounds is None:
            continue
        bad = _outside(bounds)
        with pytest.raises(ConfigError) as e:
            build_config(None, [*needs.get(r["name"], []), f"{r['name']}={bad}"])
        message = str(e.value)
        assert message.startswith(f"{r['name']}=") and " is not accepted; it must be " in message, message
        assert bounds.text().removesuffix(" (inf allowed)") in message, message
        checked += 1
    assert checked >= 50


def test_help_text_of_a_field_names_its_doc_type_default_and_allowed_values():
    from interq.train.config import config_help

    text = config_help("algo.budget")
    assert "  algo.budget (float, default 0.5; allowed: >= 0 (inf allowed))" in text
    assert "InterQ's budget B in nats" in text
    with pytest.raises(ConfigError, match=r"unknown section; accepted: run, model, env, warm_start, rollout, algo, "
                                          r"optim, train"):
        config_help("algos")


def test_docs_field_reference_is_current():
    """docs/configuration.md's field reference is what the config code generates (regenerate: the command below)."""
    from pathlib import Path

    from interq.train.config import REGENERATE_COMMAND, with_reference

    page = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"
    text = page.read_text()
    assert with_reference(text) == text, f"docs/configuration.md's field reference is out of date: run {REGENERATE_COMMAND}"
    assert "| `algo.budget` | float | `0.5` |" in text


def test_the_reference_replaces_only_what_lies_between_the_markers(tmp_path):
    from interq.train.config import REFERENCE_END, REFERENCE_START, reference_markdown, write_reference

    page = tmp_path / "configuration.md"
    page.write_text(f"# Configuration\n\nintro\n\n{REFERENCE_START}\nold table\n{REFERENCE_END}\n\nafter\n")
    assert write_reference(page) is True
    text = page.read_text()
    assert text == (f"# Configuration\n\nintro\n\n{REFERENCE_START}\n{reference_markdown()}{REFERENCE_END}\n\nafter\n")
    assert write_reference(page) is False  # already current
    new = tmp_path / "new.md"
    write_reference(new)
    assert new.read_text().startswith("# Configuration\n") and REFERENCE_START in new.read_text()
