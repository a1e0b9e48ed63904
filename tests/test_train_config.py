"""Run configuration: presets for the five arms, overrides, validation before any work."""

import math

import pytest

from interq.train.config import (
    ARMS, ConfigError, RunConfig, build_config, describe, load_config, parse_overrides, preset_names, save_config,
    with_overrides,
)

SPEC_ARMS = {  # interq-spec.md §4
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
    ("q-interq", "rollout.w_bits=3", "rollout.w_bits=3 is not accepted; it must be an integer in [4, 8]"),
    ("q-interq", "rollout.a_bits=9", "rollout.a_bits=9 is not accepted; it must be an integer in [4, 8]"),
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
