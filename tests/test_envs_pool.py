"""EnvPool: batched stepping in worker processes; killed and hung workers fail only their episode."""

from __future__ import annotations

import functools
import os
import signal
import time

import pytest

from interq.envs import make_env
from interq.envs.base import EpisodeError
from interq.envs.pool import EnvPool, EnvPoolError, FaultInjectionEnv

SIZES = {"train": 12, "valid_seen": 2, "valid_unseen": 2}


def _faulty():
    return FaultInjectionEnv(functools.partial(make_env, "household", split_sizes=SIZES))


@pytest.fixture(scope="module")
def pool():
    p = EnvPool(_faulty, num_envs=3, step_timeout_s=1.5)
    yield p
    p.close()


def _expert_run(pool, tasks):
    """Play all slots with the local expert of a reference env; returns the final results."""
    pool.reset_batch(tasks)
    final = [None] * pool.num_envs
    while any(pool.active):
        actions = pool.expert_actions()
        res = pool.step_batch([a if act else None for a, act in zip(actions, pool.active)])
        for i, r in enumerate(res):
            if r is not None and (r.terminated or r.truncated):
                final[i] = r
    return final


def test_batch_matches_single_process(pool):
    tasks = make_env("household", split_sizes=SIZES).tasks("train")[:3]
    final = _expert_run(pool, tasks)
    assert all(r.info["won"] and r.terminated for r in final)
    single = make_env("household", split_sizes=SIZES)
    obs = single.reset(tasks[1])
    assert pool.reset_batch(tasks)[1] == obs
    assert pool.tasks("train") == single.tasks("train")
    assert pool.parse_action("<action>LOOK</action>").action == "look"


def test_killed_worker_fails_only_its_episode(pool):
    tasks = pool.tasks("train")[3:6]
    obs = pool.reset_batch(tasks)
    restarts = list(pool.restarts)
    os.kill(pool.worker_pid(1), signal.SIGKILL)               # mid-episode, from outside
    res = pool.step_batch(["look", "look", "look"])
    assert res[0].info["valid_action"] and res[2].info["valid_action"]
    assert res[1].truncated and not res[1].terminated and res[1].reward == 0.0
    assert res[1].info["failure"].startswith("worker died") and res[1].info["won"] is False
    assert res[1].observation.task == tasks[1]
    assert pool.active == [True, False, True]
    with pytest.raises(EpisodeError):
        pool.step_batch([None, "look", None])                    # the failed episode has ended
    res = pool.step_batch(["look", None, "__die__"])             # a worker that kills itself
    assert res[1] is None and res[0].info["valid_action"] and "worker died" in res[2].info["failure"]
    again = pool.reset_batch(tasks)                              # restarted, same tasks, same start
    assert again == obs and pool.restarts[1] == restarts[1] + 1 and pool.restarts[2] == restarts[2] + 1


def test_hung_step_times_out(pool):
    tasks = pool.tasks("train")[:3]
    pool.reset_batch(tasks)
    t0 = time.monotonic()
    res = pool.step_batch(["look", "__hang__", "__raise__"])
    assert time.monotonic() - t0 < 30                             # bounded by the timeout, not the hang
    assert res[0].info["valid_action"] and not res[0].truncated
    assert "timed out" in res[1].info["failure"] and res[1].truncated
    assert "env error: RuntimeError: injected fault" in res[2].info["failure"]
    assert pool.active == [True, False, False]
    res = pool.step_batch(["look", None, None])                 # the rest of the batch goes on
    assert res[0].observation.text.startswith("You are in the middle")
    assert len(_expert_run(pool, tasks)) == 3


def test_programming_errors(pool):
    pool.reset_batch([pool.tasks("train")[0]])
    assert pool.active == [True, False, False]
    with pytest.raises(ValueError, match="expected 3 actions"):
        pool.step_batch(["look"])
    with pytest.raises(TypeError):
        pool.step_batch([3, None, None])
    with pytest.raises(EnvPoolError, match="UnknownTaskError"):
        pool.reset_batch([None, make_env("household").tasks("valid_seen")[0].__class__(
            env="household", task_id="train-99999", split="train")])
    pool.reset_batch([pool.tasks("train")[0]])                          # pool still usable
    assert pool.step_batch(["look", None, None])[0].info["valid_action"]
    with pytest.raises(TypeError, match="picklable"):
        EnvPool(lambda: make_env("household"), num_envs=1)
    with pytest.raises(ValueError, match="num_envs"):
        EnvPool(_faulty, num_envs=0)


def test_fault_injection_at_a_given_step_of_a_task():
    """FaultInjectionEnv(die_at_step=, hang_at_step=): the k-th step of that task's episode fails, whatever the action
    (how the trainer's tests fail a worker in the middle of a policy's episode); other tasks play on."""
    tasks = make_env("household", split_sizes=SIZES).tasks("train")[:3]
    fn = functools.partial(FaultInjectionEnv, functools.partial(make_env, "household", split_sizes=SIZES),
                           die_at_step={tasks[0].task_id: 2}, hang_at_step={tasks[1].task_id: 1})
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
