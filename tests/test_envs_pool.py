"""EnvPool: batched stepping in worker processes; killed and hung workers fail only their episode (the checks every
pool passes are in tests/pool_checks.py, also run on RayEnvPool by tests/test_envs_ray_pool.py)."""

from __future__ import annotations

import functools
import os
import signal

import pytest

from interq.envs import make_env
from interq.envs.pool import EnvPool, FaultInjectionEnv
from pool_checks import (FAULTY_HOUSEHOLD, HOUSEHOLD, SIZES, check_hung_step_times_out,
                         check_killed_worker_fails_only_its_episode, check_programming_errors, check_split_steps,
                         expert_run)


@pytest.fixture(scope="module")
def pool():
    p = EnvPool(FAULTY_HOUSEHOLD, num_envs=3, step_timeout_s=1.5)
    yield p
    p.close()


def test_batch_matches_single_process(pool):
    tasks = make_env("household", split_sizes=SIZES).tasks("train")[:3]
    final = expert_run(pool, tasks)
    assert all(r.info["won"] and r.terminated for r in final)
    single = make_env("household", split_sizes=SIZES)
    obs = single.reset(tasks[1])
    assert pool.reset_batch(tasks)[1] == obs
    assert pool.tasks("train") == single.tasks("train")
    assert pool.parse_action("<action>LOOK</action>").action == "look"


def test_killed_worker_fails_only_its_episode(pool):
    check_killed_worker_fails_only_its_episode(pool, lambda slot: os.kill(pool.worker_pid(slot), signal.SIGKILL))


def test_hung_step_times_out(pool):
    check_hung_step_times_out(pool)


@pytest.mark.slow
def test_split_steps(pool):
    check_split_steps(pool)


def test_programming_errors(pool):
    check_programming_errors(pool)
    with pytest.raises(TypeError, match="picklable"):
        EnvPool(lambda: make_env("household"), num_envs=1)
    with pytest.raises(ValueError, match="num_envs"):
        EnvPool(FAULTY_HOUSEHOLD, num_envs=0)


def test_fault_injection_at_a_given_step_of_a_task():
    """FaultInjectionEnv(die_at_step=, hang_at_step=): the k-th step of that task's episode fails, whatever the action
    (how the trainer's tests fail a worker in the middle of a policy's episode); other tasks play on."""
    tasks = make_env("household", split_sizes=SIZES).tasks("train")[:3]
    fn = functools.partial(FaultInjectionEnv, HOUSEHOLD, die_at_step={tasks[0].task_id: 2},
                           hang_at_step={tasks[1].task_id: 1})
    with EnvPool(fn, num_envs=3, step_timeout_s=2.0) as p:
        p.reset_batch(tasks)
        first = p.step_batch(["look"] * 3)
        assert first[0].info["valid_action"] and "timed out" in first[1].info["failure"]
        assert first[2].info["valid_action"]
        second = p.step_batch(["look", None, "look"])
        assert "worker died" in second[0].info["failure"] and second[2].info["valid_action"]
        assert p.active == [False, False, True]
        p.reset_batch([tasks[2], tasks[2], tasks[2]])         # replaced workers; the faults follow the task only
        assert all(r.info["valid_action"] for r in p.step_batch(["look"] * 3) + p.step_batch(["look"] * 3))
        assert p.restarts[:2] == [1, 1]


def test_a_worker_lost_at_start_is_started_again(tmp_path):
    from pool_checks import check_worker_lost_at_start_is_started_again

    check_worker_lost_at_start_is_started_again(EnvPool, tmp_path)


def test_latency_env_keeps_results_and_takes_its_time():
    import time

    from interq.envs.pool import LatencyEnv

    plain, slow = HOUSEHOLD(), LatencyEnv(HOUSEHOLD, step_latency_s=0.05, reset_latency_s=0.02)
    task = plain.tasks("train")[0]
    t0 = time.monotonic()
    assert slow.reset(task) == plain.reset(task) and time.monotonic() - t0 >= 0.02
    for action in ("look", "inventory", "not an action"):
        t0 = time.monotonic()
        assert slow.step(action) == plain.step(action)
        assert time.monotonic() - t0 >= 0.05
    with pytest.raises(ValueError, match="latencies must be >= 0"):
        LatencyEnv(HOUSEHOLD, step_latency_s=-1)


def test_an_error_in_one_half_of_an_overlapped_wave_leaves_the_pool_usable():
    """env.overlap: one half's steps are out in the workers when the other half's generation fails; the error is
    raised and the steps are collected on the way out, so the pool can be reset for the next rollout."""
    from interq.agent.loop import Episode, PooledEnvs, _drive

    with EnvPool(HOUSEHOLD, num_envs=2, step_timeout_s=30) as pool:
        envs = PooledEnvs(pool)
        tasks = pool.tasks("train")[:2]
        current = envs.reset(tasks)
        episodes = [Episode(task=t, group=0, seed=0) for t in tasks]

        def stepping():  # the first half: one action, then done
            yield {0: "look"}

        def failing():  # the second half: its generation fails
            raise RuntimeError("generation failed")
            yield  # noqa: unreachable - makes this a generator

        with pytest.raises(RuntimeError, match="generation failed"):
            _drive([stepping(), failing()], envs, episodes, current, [[], []], 0.1, False, 5)
        assert pool.reset_batch(tasks)[0] == current[0]  # nothing left stepping: the pool resets
