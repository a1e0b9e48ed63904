import os
import re

import pytest
import torch

torch.set_num_threads(int(os.environ.get("INTERQ_TEST_THREADS", "2")))

# helper modules holding checks that several test files run (tests/pool_checks.py, tests/train_helpers.py,
# tests/ulps.py): their asserts report the compared values as a test's do
pytest.register_assert_rewrite("pool_checks", "train_helpers", "ulps")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


# --------------------------------------------------------------------------- INTERQ_REQUIRE_ENGINES
# With INTERQ_REQUIRE_ENGINES=1 (set by `make test`, hence .ci/run) a test skipped because an environment's engine is
# missing (ALFWorld / textworld not importable, ScienceWorld not importable or no Java) fails instead: the README's
# test command installs them, so such a skip means the set-up is broken, not that the test does not apply. Other
# skips (verl, which has its own venv and `make test-verl`; platform conditions) stay skips.
# Ray (the env workers' scale-out backend, tests/test_envs_ray_pool.py) is held to the same rule: the README's test
# command installs it (TEST_EXTRAS), so a missing ray means the set-up is broken.
ENGINE_MODULES = ("alfworld", "textworld", "scienceworld", "ray")
_ENGINE_SKIP = re.compile(r"could not import '(%s)[.']|\bjava\b" % "|".join(ENGINE_MODULES), re.IGNORECASE)


def require_engines() -> bool:
    return os.environ.get("INTERQ_REQUIRE_ENGINES", "").strip() not in ("", "0", "false", "no")


def _skip_reason(rep) -> str:
    lr = rep.longrepr
    if isinstance(lr, tuple) and len(lr) == 3:
        return str(lr[2])
    return str(lr)


def _engine_skip_to_failure(rep) -> None:
    if not (rep.skipped and require_engines()) or hasattr(rep, "wasxfail"):
        return
    reason = _skip_reason(rep)
    if _ENGINE_SKIP.search(reason):
        rep.outcome = "failed"
        rep.longrepr = (f"INTERQ_REQUIRE_ENGINES is set but an environment engine is missing: {reason}\n"
                        "install it with scripts/setup.sh alfworld scienceworld ray (ScienceWorld also needs Java: "
                        "java -version), or unset INTERQ_REQUIRE_ENGINES to let these tests skip")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    _engine_skip_to_failure(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield  # a module-level importorskip skips the whole module at collection
    _engine_skip_to_failure(outcome.get_result())
