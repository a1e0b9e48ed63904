"""RayEnvPool: EnvPool's interface on Ray actors, on a local Ray instance on CPU (one instance for the module).

The same checks as tests/test_envs_pool.py: batched stepping equals stepping in process, a killed actor (ray.kill)
or a dead one fails only its episode and is replaced, a hung step times out, programming errors raise. Skipped only
where Ray is not importable (and under INTERQ_REQUIRE_ENGINES, i.e. `make test`, that skip is a failure).
"""

from __future__ import annotations

import functools
import subprocess
import sys
import time

import pytest

from interq.envs import make_env
from interq.envs.base import EpisodeError
from interq.envs.pool import EnvPoolError, FaultInjectionEnv

SIZES = {"train": 12, "valid_seen": 2, "valid_unseen": 2}
ENV_FN = functools.partial(FaultInjectionEnv, functools.partial(make_env, "household", split_sizes=SIZES))


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

    p = RayEnvPool(ENV_FN, num_envs=3, step_timeout_s=2.0)
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


def _expert_run(pool, tasks):
    pool.reset_batch(tasks)
    final = [None] * pool.num_envs
    while any(pool.active):
        actions = pool.expert_actions()
        res = pool.step_batch([a if act else None for a, act in zip(actions, pool.active)])
        for i, r in enumerate(res):
            if r is not None and (r.terminated or r.truncated):
                final[i] = r
    return final


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
    final = _expert_run(pool, tasks)
    assert all(r.info["won"] and r.terminated for r in final)
    assert pool.parse_action("<action>LOOK</action>").action == "look"
    assert all(isinstance(pool.worker_pid(i), int) for i in range(3))


def test_killed_actor_fails_only_its_episode_and_is_replaced(pool, ray):
    tasks = pool.tasks("train")[3:6]
    obs = pool.reset_batch(tasks)
    restarts, old = list(pool.restarts), pool.actor(1)
    ray.kill(old)                                               # mid-episode, from outside
    _wait_dead(ray, old)
    res = pool.step_batch(["look", "look", "look"])
    assert res[0].info["valid_action"] and res[2].info["valid_action"]
    assert res[1].truncated and not res[1].terminated and res[1].reward == 0.0
    assert res[1].info["failure"].startswith("worker died") and res[1].info["won"] is False
    assert pool.failures[-1] == (1, res[1].info["failure"]) and "ray.kill" in res[1].info["failure"]
    assert res[1].observation.task == tasks[1]
    assert pool.active == [True, False, True] and pool.actor(1) is None
    with pytest.raises(EpisodeError):
        pool.step_batch([None, "look", None])                    # the failed episode has ended
    res = pool.step_batch(["look", None, "__die__"])             # an actor that kills itself
    assert res[1] is None and res[0].info["valid_action"] and "worker died" in res[2].info["failure"]
    again = pool.reset_batch(tasks)                              # replaced, same tasks, same start
    assert again == obs and pool.restarts[1] == restarts[1] + 1 and pool.restarts[2] == restarts[2] + 1
    assert pool.actor(1) is not None and pool.actor(1) != old
    assert pool.step_batch(["look", "look", "look"])[1].info["valid_action"]


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
    tasks = pool.tasks("train")[:3]
    pool.reset_batch(tasks)
    restarts = list(pool.restarts)
    t0 = time.monotonic()
    res = pool.step_batch(["look", "__hang__", "__raise__"])
    assert time.monotonic() - t0 < 30                             # bounded by the timeout, not the hang
    assert res[0].info["valid_action"] and not res[0].truncated
    assert "timed out" in res[1].info["failure"] and res[1].truncated
    assert "env error: RuntimeError: injected fault" in res[2].info["failure"]
    assert pool.active == [True, False, False]
    res = pool.step_batch(["look", None, None])                  # the rest of the batch goes on
    assert res[0].observation.text.startswith("You are in the middle")
    assert len(_expert_run(pool, tasks)) == 3
    assert pool.restarts == [restarts[0], restarts[1] + 1, restarts[2] + 1]


def test_programming_errors_and_bad_arguments(pool):
    from interq.envs.ray_pool import RayEnvPool

    pool.reset_batch([pool.tasks("train")[0]])
    assert pool.active == [True, False, False]
    with pytest.raises(ValueError, match="expected 3 actions"):
        pool.step_batch(["look"])
    with pytest.raises(TypeError, match="slot 0 must be a str"):
        pool.step_batch([3, None, None])
    with pytest.raises(ValueError, match="4 tasks for 3 slots"):
        pool.reset_batch(pool.tasks("train")[:4])
    with pytest.raises(EnvPoolError, match="UnknownTaskError"):
        pool.reset_batch([None, make_env("household").tasks("valid_seen")[0].__class__(
            env="household", task_id="train-99999", split="train")])
    pool.reset_batch([pool.tasks("train")[0]])                   # pool still usable
    assert pool.step_batch(["look", None, None])[0].info["valid_action"]
    with pytest.raises(ValueError, match="num_envs"):
        RayEnvPool(ENV_FN, num_envs=0)
    with pytest.raises(ValueError, match="step_timeout_s"):
        RayEnvPool(ENV_FN, num_envs=1, step_timeout_s=0)
    with pytest.raises(TypeError, match="actor_options"):
        RayEnvPool(ENV_FN, num_envs=1, actor_options=["num_cpus", 1])


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
