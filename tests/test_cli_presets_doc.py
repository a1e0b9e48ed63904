"""``interq --help`` names every preset that ships (read from the package, so it cannot fall behind)."""

from importlib import resources

from interq.cli import main


def test_help_lists_every_preset(capsys):
    shipped = sorted(p.name.removesuffix(".yaml") for p in resources.files("interq.presets").iterdir()
                     if p.name.endswith(".yaml"))
    assert {"bf16", "q-interq", "household", "alfworld", "scienceworld", "synthshop"} <= set(shipped)
    assert main(["--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    missing = [name for name in shipped if f" {name}," not in text and f" {name} " not in text]
    assert not missing, f"interq --help does not name the presets {missing}"
