"""Checks every environment pool passes, whatever carries its messages: tests/test_envs_pool.py runs them on
``EnvPool`` (worker processes), tests/test_envs_ray_pool.py on ``RayEnvPool`` (Ray actors). Each takes a pool of 3
slots over :data:`FAULTY_HOUSEHOLD` (``__die__``, ``__hang__`` and ``__raise__`` actions inject failures) whose step
timeout is a few seconds."""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable

import pytest

from interq.envs import make_env
from interq.envs.base import EpisodeError, StepResult, TaskSpec
from interq.envs.pool import EnvPoolError, FaultInjectionEnv

SIZES = {"train": 12, "valid_seen": 2, "valid_unseen": 2}
HOUSEHOLD = functools.partial(make_env, "household", split_sizes=SIZES)
FAULTY_HOUSEHOLD = functools.partial(FaultInjectionEnv, HOUSEHOLD)  # picklable: workers and actors build it


def expert_run(pool, tasks) -> list[StepResult | None]:
    """Play all slots with each slot's expert until every episode ended; the final result per slot."""
    pool.reset_batch(tasks)
    final = [None] * pool.num_envs
    while any(pool.active):
        actions = pool.expert_actions()
        res = pool.step_batch([a if act else None for a, act in zip(actions, pool.active)])
        for i, r in enumerate(res):
            if r is not None and (r.terminated or r.truncated):
                final[i] = r
    return final


def check_killed_worker_fails_only_its_episode(pool, kill: Callable[[int], None],
                                               after_failure: Callable[[list], None] | None = None) -> None:
    """``kill(1)`` kills slot 1's worker from outside in the middle of an episode: the next step fails only that
    episode (``after_failure`` sees that step's results), which has then ended; a worker that kills itself is
    reported the same way; the next ``reset_batch`` replaces both and starts the same episodes again."""
    tasks = pool.tasks("train")[3:6]
    obs = pool.reset_batch(tasks)
    restarts = list(pool.restarts)
    kill(1)
    res = pool.step_batch(["look", "look", "look"])
    assert res[0].info["valid_action"] and res[2].info["valid_action"]
    assert res[1].truncated and not res[1].terminated and res[1].reward == 0.0
    assert res[1].info["failure"].startswith("worker died") and res[1].info["won"] is False
    assert res[1].observation.task == tasks[1] and (1, res[1].info["failure"]) in pool.failures
    assert pool.active == [True, False, True]
    if after_failure is not None:
        after_failure(res)
    with pytest.raises(EpisodeError):
        pool.step_batch([None, "look", None])                    # the failed episode has ended
    res = pool.step_batch(["look", None, "__die__"])             # a worker that kills itself
    assert res[1] is None and res[0].info["valid_action"] and "worker died" in res[2].info["failure"]
    again = pool.reset_batch(tasks)                              # replaced, same tasks, same start
    assert again == obs and pool.restarts[1] == restarts[1] + 1 and pool.restarts[2] == restarts[2] + 1
    assert pool.step_batch(["look", "look", "look"])[1].info["valid_action"]


def check_hung_step_times_out(pool) -> None:
    """A hung step fails its episode within the step timeout, an env that raises fails its own; the rest of the
    batch goes on, and both workers are replaced at the next reset."""
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
    assert len(expert_run(pool, tasks)) == 3
    assert pool.restarts == [restarts[0], restarts[1] + 1, restarts[2] + 1]


def check_programming_errors(pool) -> None:
    """Wrong batch sizes, non-str actions and unknown tasks raise before anything is sent; the pool stays usable."""
    pool.reset_batch([pool.tasks("train")[0]])
    assert pool.active == [True, False, False]
    with pytest.raises(ValueError, match="expected 3 actions"):
        pool.step_batch(["look"])
    with pytest.raises(TypeError, match="slot 0 must be a str"):
        pool.step_batch([3, None, None])
    with pytest.raises(ValueError, match="4 tasks for 3 slots"):
        pool.reset_batch(pool.tasks("train")[:4])
    with pytest.raises(EnvPoolError, match="UnknownTaskError"):
        pool.reset_batch([None, TaskSpec(env="household", task_id="train-99999", split="train")])
    pool.reset_batch([pool.tasks("train")[0]])                   # pool still usable
    assert pool.step_batch(["look", None, None])[0].info["valid_action"]


def check_split_steps(pool) -> None:
    """``step_submit`` / ``step_collect``: tickets over disjoint slots out together, collected in any order, give
    the results ``step_batch`` gives; an answer already in is taken even when collected after the step timeout; a
    hung slot in one ticket times out without touching the other; a slot cannot be stepped twice at once, nor the
    pool reset, while a ticket is out; a ticket is collected once."""
    tasks = pool.tasks("train")[6:9]
    pool.reset_batch(tasks)
    reference = pool.step_batch(["look", "inventory", "look"])
    pool.reset_batch(tasks)
    a = pool.step_submit(["look", None, None])
    b = pool.step_submit([None, "inventory", "look"])
    with pytest.raises(EpisodeError, match="slot 0 is still stepping"):
        pool.step_submit(["look", None, None])
    with pytest.raises(EpisodeError, match="still stepping"):
        pool.reset_batch(tasks)
    got_b, got_a = pool.step_collect(b), pool.step_collect(a)   # out of order
    assert got_a[1:] == [None, None] and got_b[0] is None
    assert [got_a[0], got_b[1], got_b[2]] == reference
    with pytest.raises(EpisodeError, match="already collected"):
        pool.step_collect(a)
    late = pool.step_submit(["look", None, None])
    time.sleep(pool.step_timeout_s + 0.5)                         # the answer came long ago: not a timeout
    assert pool.step_collect(late)[0].info["valid_action"]
    hung = pool.step_submit([None, None, "__hang__"])
    fine = pool.step_submit(["look", "look", None])
    res = pool.step_collect(fine)
    assert res[0].info["valid_action"] and res[1].info["valid_action"]
    res = pool.step_collect(hung)
    assert f"no answer within {pool.step_timeout_s:g} s" in res[2].info["failure"] and pool.active == [True, True, False]
    pool.reset_batch(tasks)                                       # slot 2's worker replaced; the pool goes on
    assert pool.step_batch(["look", "inventory", "look"]) == reference


def die_once_then_household(marker: str):
    """An env_fn whose first call kills its own process (a worker lost at start, as under memory or load pressure,
    before it can report anything); later calls build the household env. ``marker``: a path, created by the first call."""
    if not os.path.exists(marker):
        open(marker, "w").close()
        os._exit(1)
    return HOUSEHOLD()


def check_worker_lost_at_start_is_started_again(pool_cls, tmp_path) -> None:
    pool = pool_cls(functools.partial(die_once_then_household, str(tmp_path / "died")), num_envs=1)
    try:
        assert pool.restarts == [1] and "worker died" in pool.failures[0][1]
        obs = pool.reset_batch(pool.tasks("train")[:1])
        assert obs[0] is not None
    finally:
        pool.close()
