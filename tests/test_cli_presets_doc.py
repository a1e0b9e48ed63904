"""``interq --help`` names every preset that ships (the module docstring of interq.cli had fallen behind)."""

from importlib import resources

from interq import cli


def test_help_lists_every_preset():
    shipped = sorted(p.name.removesuffix(".yaml") for p in resources.files("interq.presets").iterdir()
                     if p.name.endswith(".yaml"))
    assert {"bf16", "q-interq", "household", "alfworld", "scienceworld", "synthshop"} <= set(shipped)
    missing = [name for name in shipped if f"``{name}``" not in cli.__doc__]
    assert not missing, f"interq.cli's docstring (interq --help) does not name the presets {missing}"
