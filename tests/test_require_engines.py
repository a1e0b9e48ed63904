"""INTERQ_REQUIRE_ENGINES=1 (set by `make test`, so by .ci/run): a test skipped for a missing environment engine
fails; every other skip stays a skip."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = '''
import sys
import pytest

def test_textworld_missing():
    sys.modules["textworld"] = None
    pytest.importorskip("textworld")

def test_scienceworld_missing():
    sys.modules["scienceworld"] = None
    pytest.importorskip("scienceworld")

def test_no_java():
    pytest.skip("Java is not installed")

def test_ray_missing():  # the env workers' Ray backend: installed by the test command too
    sys.modules["ray"] = None
    pytest.importorskip("ray")

def test_verl_missing():  # verl has its own venv and `make test-verl`: a skip in .venv
    sys.modules["verl"] = None
    pytest.importorskip("verl")

def test_platform():
    pytest.skip("no /proc")

@pytest.mark.xfail(reason="java is slow", strict=False)
def test_xfail():
    assert False
'''
MODULE_SKIP = '''
import sys
import pytest
sys.modules["alfworld"] = None
pytest.importorskip("alfworld.info")

def test_never_runs():
    pass
'''


def _pytest(tmp_path, name, require):
    env = {k: v for k, v in os.environ.items() if k != "INTERQ_REQUIRE_ENGINES"}
    if require is not None:
        env["INTERQ_REQUIRE_ENGINES"] = require
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rA", name],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    return res.returncode, res.stdout + res.stderr


def _counts(out):
    last = out.strip().splitlines()[-1]
    return {k: int(n) for n, k in re.findall(r"(\d+) (failed|passed|skipped|xfailed|errors?)", last)}


@pytest.fixture
def suite(tmp_path):
    shutil.copy(Path(__file__).with_name("conftest.py"), tmp_path / "conftest.py")
    (tmp_path / "test_skips.py").write_text(TESTS)
    (tmp_path / "test_module_skip.py").write_text(MODULE_SKIP)
    return tmp_path


@pytest.mark.slow
@pytest.mark.parametrize("require", [None, "0"])
def test_without_the_switch_missing_engines_skip(suite, require):
    rc, out = _pytest(suite, "test_skips.py", require)
    assert rc == 0 and _counts(out) == {"skipped": 6, "xfailed": 1}, out
    rc, out = _pytest(suite, "test_module_skip.py", require)
    assert rc in (0, 5) and _counts(out) == {"skipped": 1}, out  # 5: no test collected (the module skipped)


@pytest.mark.slow
def test_with_the_switch_missing_engines_fail_and_other_skips_stay(suite):
    rc, out = _pytest(suite, "test_skips.py", "1")
    assert rc == 1 and _counts(out) == {"failed": 4, "skipped": 2, "xfailed": 1}, out
    for name in ("test_textworld_missing", "test_scienceworld_missing", "test_no_java", "test_ray_missing"):
        assert re.search(rf"FAILED test_skips.py::{name}\b", out), name
    assert "INTERQ_REQUIRE_ENGINES is set but an environment engine is missing" in out
    assert re.search(r"SKIPPED \[1\] test_skips.py:\d+: could not import 'verl'", out), out
    rc, out = _pytest(suite, "test_module_skip.py", "1")  # a module-level importorskip: a collection error
    assert rc != 0 and "could not import 'alfworld.info'" in out and "INTERQ_REQUIRE_ENGINES" in out, out
