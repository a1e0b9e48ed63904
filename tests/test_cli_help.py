"""The command line's front door: ``interq --help`` lists every command on one line with its sentence,
``interq --version`` prints the package version, every command that takes overrides has ``--help-config
[SECTION]`` (the fields' own docs, types, defaults and allowed values), and one default preset serves them all."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from interq import __version__, cli
from interq.cli import main
from interq.train.config import DEFAULT_PRESET, field_reference, sections

OVERRIDE_COMMANDS = ["train", "sft", "eval", "demo", "compare", "mismatch"]
PRESET_COMMANDS = ["train", "sft", "eval", "mismatch"]  # demo and compare run arms, each its own preset


def test_help_lists_each_command_on_one_line_with_its_sentence(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["--help"]) == 0
    text = capsys.readouterr().out
    assert set(cli.COMMANDS) == {"train", "sft", "eval", "demo", "compare", "mismatch", "selfcheck"}
    for name, (_, sentence) in cli.COMMANDS.items():
        lines = [line for line in text.splitlines() if line.startswith(f"    {name} ")]
        assert len(lines) == 1, (name, text)
        assert lines[0].split(None, 1)[1] == sentence and len(lines[0]) <= 80
        assert sentence[0].isupper() and sentence.endswith(".") and ". " not in sentence  # one sentence
    assert "``" not in text and ":mod:" not in text  # no docstring markup


def test_no_arguments_prints_the_help_and_fails(capsys):
    assert main([]) == 2
    assert "<command>" in capsys.readouterr().out


def test_an_unknown_command_is_refused_naming_the_commands(capsys):
    with pytest.raises(SystemExit) as e:
        main(["trian"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "'trian'" in err and all(f"'{c}'" in err for c in cli.COMMANDS)


def test_version_is_the_package_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"interq {__version__}\n"
    pyproject = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    assert __version__ == pyproject["project"]["version"], "the installed metadata is stale: pip install -e ."


@pytest.mark.parametrize("command", OVERRIDE_COMMANDS)
def test_help_config_lists_every_field_with_its_doc(command, capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    assert main([command, "--help-config"]) == 0
    text = capsys.readouterr().out
    for rec in field_reference():
        assert f"  {rec['name']} ({rec['type']}, default {rec['default']!r}" in text, rec["name"]
        assert " ".join(rec["doc"].split()[:6]) in " ".join(text.split()), rec["name"]
    assert "allowed: none, tis, icepop, seq_is, geo_mask, prefix_is, interq, interq_uniform" in text
    assert not any(tmp_path.iterdir())  # nothing was built or written


@pytest.mark.parametrize("command", OVERRIDE_COMMANDS)
def test_help_config_section_lists_only_that_section(command, capsys):
    assert main([command, "--help-config", "algo"]) == 0
    names = [line.split()[0] for line in capsys.readouterr().out.splitlines() if line.startswith("  ") and
             not line.startswith("   ")]
    assert names == [r["name"] for r in field_reference() if r["section"] == "algo"]


@pytest.mark.parametrize("command", OVERRIDE_COMMANDS)
def test_help_config_refuses_an_unknown_section_in_one_line(command, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main([command, "--help-config", "algorithm"]) == 2
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("interq: ") and "'algorithm'" in lines[0], captured.err
    assert all(s in lines[0] for s in sections()) and captured.out == ""
    assert not any(tmp_path.iterdir())


def test_help_config_shows_the_presets_values(capsys):
    assert main(["train", "--help-config", "algo.correction"]) == 0
    assert "  algo.correction (str, default 'tis'; preset 'interq';" in capsys.readouterr().out
    assert main(["train", "--preset", "bf16", "--help-config", "rollout.executor"]) == 0
    line = [x for x in capsys.readouterr().out.splitlines() if x.startswith("  rollout.executor (")]
    assert line == ["  rollout.executor (str, default 'bf16'; allowed: bf16, fp32, w8a8)"]  # bf16's is the default


@pytest.mark.parametrize("command", PRESET_COMMANDS)
def test_every_preset_command_defaults_to_the_same_preset(command, capsys):
    assert DEFAULT_PRESET == "q-interq"
    with pytest.raises(SystemExit) as e:
        main([command, "--help"])
    assert e.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert f"--preset PRESET preset name or YAML path (default: {DEFAULT_PRESET})" in text
    assert "--force" in text and "--help-config [SECTION]" in text


@pytest.mark.parametrize("command", ["demo", "compare"])
def test_arm_commands_take_help_config_and_force(command, capsys):
    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = capsys.readouterr().out
    assert "--help-config [SECTION]" in text and "--force" in text


def test_top_level_help_names_the_default_preset(capsys):
    assert main(["--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert f"start from {DEFAULT_PRESET} unless --preset names another" in text
