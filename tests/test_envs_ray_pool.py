"""RayEnvPool: EnvPool's interface on Ray actors, on a local Ray instance on CPU (one instance for the module).

The checks every pool passes (tests/pool_checks.py, also run on EnvPool by tests/test_envs_pool.py): a killed actor
(ray.kill) or a dead one fails only its episode and is replaced, a hung step times out, programming errors raise; and
here: batched stepping equals stepping in process, an actor lost outside a step is reported at the next. Skipped only
where Ray is not importable (and under INTERQ_REQUIRE_ENGINES, i.e. `make test`, that skip is a failure).
"""

from __future__ import annotations

import functools
import subprocess
import sys
import time

import pytest

from interq.envs import make_env
from interq.envs.pool import EnvPoolError
from pool_checks import (FAULTY_HOUSEHOLD, SIZES, check_hung_step_times_out, check_killed_worker_fails_only_its_episode,
                         check_programming_errors, check_split_steps, expert_run)

pytestmark = pytest.mark.slow  # Ray actors take seconds to start (module fixture) and to replace


@pytest.fixture(scope="module")
def ray():
    ray = pytest.importorskip("ray")
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, object_store_memory=80 * 1024 ** 2,
                 logging_level="ERROR")
    yield ray
    if started:
        ray.shutdown()


@pytest.fixture(scope="module")
def pool(ray):
    from interq.envs.ray_pool import RayEnvPool

    p = RayEnvPool(FAULTY_HOUSEHOLD, num_envs=3, step_timeout_s=2.0)
    yield p
    p.close()


def _wait_dead(ray, actor, timeout_s=30.0):
    """ray.kill is asynchronous: wait until the actor's death is visible to callers."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            ray.get(actor.ready.remote(), timeout=5)
        except ray.exceptions.RayActorError:
            return
        except ray.exceptions.GetTimeoutError:
            pass
        time.sleep(0.1)
    raise AssertionError("the killed actor still answers")


def test_steps_equal_in_process_stepping(pool):
    """Every observation, reward, flag and info of an episode stepped through the actors equals stepping the same
    actions in this process (expert actions mixed with invalid and random admissible ones)."""
    import random

    tasks = make_env("household", split_sizes=SIZES).tasks("train")[:3]
    local = [make_env("household", split_sizes=SIZES) for _ in tasks]
    assert pool.reset_batch(tasks) == [env.reset(t) for env, t in zip(local, tasks)]
    rng = random.Random(0)
    steps = 0
    while any(pool.active):
        actions = []
        for env, act in zip(local, pool.active):
            if not act:
                actions.append(None)
                continue
            u = rng.random()
            actions.append("jump around" if u < 0.1 else rng.choice(env.admissible_actions()) if u < 0.3
                           else env.expert_action())
        got = pool.step_batch(actions)
        want = [env.step(a) if a is not None else None for env, a in zip(local, actions)]
        assert got == want
        steps += sum(a is not None for a in actions)
    assert steps > 10 and pool.tasks("train") == local[0].tasks("train")
    final = expert_run(pool, tasks)
    assert all(r.info["won"] and r.terminated for r in final)
    assert pool.parse_action("<action>LOOK</action>").action == "look"
    assert all(isinstance(pool.worker_pid(i), int) for i in range(3))


def test_killed_actor_fails_only_its_episode_and_is_replaced(pool, ray):
    old = pool.actor(1)

    def kill(slot):
        ray.kill(pool.actor(slot))
        _wait_dead(ray, old)

    def after_failure(res):
        assert "ray.kill" in res[1].info["failure"] and pool.actor(1) is None

    check_killed_worker_fails_only_its_episode(pool, kill, after_failure)
    assert pool.actor(1) is not None and pool.actor(1) != old


def test_actor_lost_outside_a_step_is_reported_at_the_next_step(pool, ray):
    tasks = pool.tasks("train")[:3]
    pool.reset_batch(tasks)
    victim = pool.actor(2)
    ray.kill(victim)
    _wait_dead(ray, victim)
    assert pool.expert_actions()[2] is None and pool.active[2]   # not silently dropped: still open ...
    res = pool.step_batch(["look", None, "look"])                # ... and reported failed here
    assert res[0].info["valid_action"] and "worker died" in res[2].info["failure"] and res[2].truncated
    assert pool.active == [True, True, False]
    pool.reset_batch(tasks)
    assert pool.step_batch(["look"] * 3)[2].info["valid_action"]


def test_hung_step_times_out(pool):
    check_hung_step_times_out(pool)


def test_split_steps(pool):
    check_split_steps(pool)


def test_programming_errors_and_bad_arguments(pool):
    from interq.envs.ray_pool import RayEnvPool

    check_programming_errors(pool)
    with pytest.raises(TypeError, match="slot 1 must be a TaskSpec"):
        pool.reset_batch([None, "train-00000"])
    with pytest.raises(ValueError, match="num_envs"):
        RayEnvPool(FAULTY_HOUSEHOLD, num_envs=0)
    with pytest.raises(ValueError, match="step_timeout_s"):
        RayEnvPool(FAULTY_HOUSEHOLD, num_envs=1, step_timeout_s=0)
    with pytest.raises(TypeError, match="actor_options"):
        RayEnvPool(FAULTY_HOUSEHOLD, num_envs=1, actor_options=["num_cpus", 1])


def test_an_env_that_cannot_be_built_fails_the_start(ray):
    from interq.envs.ray_pool import RayEnvPool

    with pytest.raises(EnvPoolError, match=r"failed to start.*unknown env 'nope'"):
        RayEnvPool(functools.partial(make_env, "nope"), num_envs=1, start_timeout_s=60)


def test_interq_imports_without_ray_and_says_how_to_install_it():
    code = ("import sys; sys.modules['ray'] = None\n"
            "import interq, interq.envs, interq.envs.ray_pool as rp\n"
            "from interq._optional import MissingDependency\n"
            "try:\n    rp.RayEnvPool.from_name('household', num_envs=1)\n"
            "except MissingDependency as e:\n    print('MISSING', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "MISSING" in out.stdout and "pip install 'interq[ray]'" in out.stdout and "setup.sh ray" in out.stdout


def test_an_actor_lost_at_start_is_started_again(ray, tmp_path):
    import pool_checks
    from interq.envs.ray_pool import RayEnvPool

    ray.cloudpickle.register_pickle_by_value(pool_checks)  # the actors cannot import the tests' helper module
    try:
        pool_checks.check_worker_lost_at_start_is_started_again(RayEnvPool, tmp_path)
    finally:
        ray.cloudpickle.unregister_pickle_by_value(pool_checks)
