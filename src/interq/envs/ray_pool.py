"""Environments as Ray actors: :class:`EnvPool`'s interface, with workers that can live anywhere in a Ray cluster.

``RayEnvPool`` runs one environment per slot, each in its own Ray actor, and steps all slots at once, the way
verl-agent runs its environment workers. It has :class:`~interq.envs.pool.EnvPool`'s interface and failure
semantics, so code written against one runs on the other:

    pool = RayEnvPool.from_name("alfworld", num_envs=8, step_timeout_s=60, source="generated")
    obs = pool.reset_batch(tasks)                     # one TaskSpec (or None: idle) per slot
    results = pool.step_batch(actions)                # one action (or None: skip) per slot
    pool.close()

Ray is optional (``pip install 'interq[ray]'`` or ``scripts/setup.sh ray``); ``import interq`` and this module
work without it, and building a pool without it raises :class:`~interq._optional.MissingDependency` saying so.

Where the actors run: the pool uses the Ray instance the process is connected to. Connect first
(``ray.init(address="auto")`` for a cluster, ``ray.init(num_cpus=2)`` for a local instance); if the process is
not connected, the pool calls ``ray.init(**ray_init)`` (default: a local instance). ``actor_options`` go to
``.options()`` of every actor (e.g. ``{"num_cpus": 1}`` to reserve a core per environment, or
``{"resources": {"env_host": 1}}`` to pin them to some nodes); by default an actor reserves no CPU while it
runs (Ray's default for actors), so more environments than cores can run, as with the process pool. The pool
never shuts Ray down: other users of the instance may still need it.

Failure handling (the affected episode is reported as failed, never silently dropped), as in
``EnvPool``:

- An actor that dies (``ray.kill``, a crash, its node lost) or does not answer a step within ``step_timeout_s``
  is killed; that slot's result is a :class:`StepResult` with ``truncated=True``, ``terminated=False``, reward 0,
  ``info["failure"] = "worker died: ..."`` / ``"worker timed out: ..."`` and ``info["won"] = False``. The other
  slots' results are returned as usual. A new actor replaces it (lazily, at the slot's next ``reset_batch``) and
  ``restarts[slot]`` counts it.
- An exception raised inside the environment's ``step`` is reported the same way
  (``info["failure"] = "env error: <Type>: <message>"``) and the actor is replaced.
- ``reset_batch``: a slot whose reset fails gets a new actor and is retried (``reset_retries`` times); if it
  fails again, :class:`EnvPoolError` is raised after every other slot was reset, so the pool stays usable.
- An actor lost while answering ``expert_actions`` or ``call`` (died or timed out) leaves its episode running in
  name only: the slot's next ``step_batch`` reports that episode failed (the same failure result, without
  sending anything), so the loss is never silent. (``EnvPool`` ends such an episode at once instead; a caller
  that checks ``active`` sees the same thing from both.)
- Programming mistakes raise before anything is sent: a wrong number of actions, stepping a slot that has no
  running episode, a non-str action (:class:`~interq.envs.base.EpisodeError` / TypeError / ValueError).
"""

from __future__ import annotations

import functools
import os
import re
import time
from collections.abc import Callable, Mapping
from typing import Any

from .._optional import MissingDependency
from .base import Env, Observation, StepResult, TaskSpec
from .pool import BatchPool, EnvPoolError, SlotState

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
INSTALL_HINT = "pip install 'interq[ray]'   (or: scripts/setup.sh ray)"


def import_ray():
    """``ray``, or MissingDependency naming the install command."""
    try:
        import ray
    except ImportError as e:
        raise MissingDependency(f"RayEnvPool needs Ray, which could not be imported ({e}). Install it with: "
                                f"{INSTALL_HINT}") from e
    return ray


class _EnvWorker:
    """What runs inside each actor: one environment, built from ``env_fn`` in the actor's process."""

    def __init__(self, env_fn: Callable[[], Env]):
        self.env = env_fn()

    def ready(self) -> int:
        return os.getpid()

    def reset(self, task: TaskSpec) -> Observation:
        return self.env.reset(task)

    def step(self, action: str) -> StepResult:
        return self.env.step(action)

    def call(self, method: str, args: tuple) -> Any:
        return getattr(self.env, method)(*args)

    def close(self) -> None:
        self.env.close()


@functools.lru_cache(maxsize=1)
def _actor_class():
    ray = import_ray()
    # max_restarts=0: a dead actor stays dead; the pool replaces it itself, so it can count and report the loss
    return ray.remote(max_restarts=0, max_task_retries=0)(_EnvWorker)


class _Slot(SlotState):
    def __init__(self) -> None:
        super().__init__()
        self.actor: Any = None
        self.pid: int | None = None


def _describe(ray, err: BaseException) -> str:
    """An exception from ``ray.get`` as a failure reason (the prefixes are EnvPool's)."""
    if isinstance(err, ray.exceptions.RayTaskError):  # raised by the env inside a living actor
        cause = err.cause if getattr(err, "cause", None) is not None else err
        return f"env error: {type(cause).__name__}: {cause}"
    lines = [ln.strip() for ln in _ANSI.sub("", str(err)).splitlines() if ln.strip()]
    if isinstance(err, ray.exceptions.RayActorError) and err.actor_init_failed:  # __init__ (env_fn) raised
        return f"worker died: env could not be built: {lines[-1] if lines else type(err).__name__}"
    # Ray's message: a headline, tab-indented details (class, actor id, pid, ip), then why it died
    why = [ln for ln in str(err).splitlines()[1:] if ln.strip() and not ln.startswith("\t")]
    return f"worker died: {type(err).__name__}: {' '.join(why) if why else (lines[0] if lines else '')}".rstrip(": ")


class RayEnvPool(BatchPool):
    """A batch of environments in Ray actors (see the module docstring); ``EnvPool``'s interface and batch API
    (:class:`~interq.envs.pool.BatchPool`), with Ray carrying the messages.

    Args:
        env_fn: zero-argument callable returning an Env, serializable by Ray (e.g.
            ``functools.partial(make_env, "household", max_steps=50)``); see :meth:`from_name`.
        num_envs: number of slots (actors).
        step_timeout_s: a step that takes longer fails its slot (the actor is killed and replaced).
        reset_timeout_s: same for reset and other calls (default: max(step_timeout_s, 60)).
        start_timeout_s: time a new actor has to build its env (includes Ray starting its worker process).
        reset_retries: replacements tried for a slot whose reset fails before EnvPoolError.
        actor_options: passed to every actor's ``.options()`` (``num_cpus``, ``resources``, ``runtime_env``, ...).
        ray_init: ``ray.init`` keyword arguments, used only when this process is not yet connected to Ray.
    """

    _unit = "actors"

    def __init__(self, env_fn: Callable[[], Env], num_envs: int, step_timeout_s: float = 60.0,
                 reset_timeout_s: float | None = None, start_timeout_s: float = 120.0, reset_retries: int = 1,
                 actor_options: Mapping[str, Any] | None = None, ray_init: Mapping[str, Any] | None = None):
        if not isinstance(num_envs, int) or isinstance(num_envs, bool) or num_envs < 1:
            raise ValueError(f"num_envs must be a positive int; got {num_envs!r}")
        if not callable(env_fn):
            raise TypeError(f"env_fn must be a zero-argument callable returning an Env; got {type(env_fn).__name__}")
        for name, v in (("step_timeout_s", step_timeout_s), ("start_timeout_s", start_timeout_s)):
            if not isinstance(v, (int, float)) or not v > 0:
                raise ValueError(f"{name} must be a number > 0; got {v!r}")
        if reset_timeout_s is not None and (not isinstance(reset_timeout_s, (int, float)) or not reset_timeout_s > 0):
            raise ValueError(f"reset_timeout_s must be a number > 0 or None; got {reset_timeout_s!r}")
        if not isinstance(reset_retries, int) or reset_retries < 0:
            raise ValueError(f"reset_retries must be a non-negative int; got {reset_retries!r}")
        if actor_options is not None and not isinstance(actor_options, Mapping):
            raise TypeError(f"actor_options must be a mapping of Ray actor options (e.g. {{'num_cpus': 1}}); "
                            f"got {type(actor_options).__name__}")
        if ray_init is not None and not isinstance(ray_init, Mapping):
            raise TypeError(f"ray_init must be a mapping of ray.init keyword arguments; got {type(ray_init).__name__}")
        self._ray = ray = import_ray()
        if not ray.is_initialized():
            ray.init(**dict(ray_init or {}))
        self.actor_options = dict(actor_options or {})
        self._cls = _actor_class().options(**self.actor_options) if self.actor_options else _actor_class()
        self._setup(env_fn, num_envs, step_timeout_s, reset_timeout_s, start_timeout_s, reset_retries, _Slot)

    @classmethod
    def from_name(cls, name: str, num_envs: int, step_timeout_s: float = 60.0,
                  actor_options: Mapping[str, Any] | None = None, **env_kwargs: Any) -> "RayEnvPool":
        """A pool of ``make_env(name, **env_kwargs)``."""
        from . import make_env
        return cls(functools.partial(make_env, name, **env_kwargs), num_envs, step_timeout_s=step_timeout_s,
                   actor_options=actor_options)

    # ---- actor management ----------------------------------------------------------------------
    def _start(self, slots: list[int]) -> None:
        """Start actors for ``slots`` at once and wait until each has built its env (or failed)."""
        refs = {}
        for i in slots:
            s = self._slots[i]
            s.actor = self._cls.remote(self.env_fn)
            s.healthy = s.active = False
            s.lost = None
            refs[i] = s.actor.ready.remote()
        for i, (ok, payload) in self._wait(refs, self.start_timeout_s).items():
            if ok:
                self._slots[i].healthy, self._slots[i].pid = True, payload
            else:
                self._fail(i, f"worker failed to start: {payload}")

    def _kill(self, i: int) -> None:
        s = self._slots[i]
        if s.actor is not None:
            try:
                self._ray.kill(s.actor, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass
        s.actor, s.pid, s.healthy, s.active, s.lost = None, None, False, False, None

    def _wait(self, refs: dict[int, Any], timeout_s: float, limit_s: float | None = None) -> dict[int, tuple[bool, Any]]:
        """Wait for every ref at most ``timeout_s``. Returns {slot: (ok, result or failure reason)}."""
        ray = self._ray
        out: dict[int, tuple[bool, Any]] = {}
        by_ref = {ref: i for i, ref in refs.items()}
        pending = list(by_ref)
        deadline, polled = time.monotonic() + timeout_s, False
        while pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0 and polled:
                break
            remaining, polled = max(remaining, 0.0), True  # answers already in are taken even when no time is left
            ready, pending = ray.wait(pending, num_returns=len(pending), timeout=remaining)
            for ref in ready:
                i = by_ref[ref]
                try:
                    out[i] = (True, ray.get(ref))
                except Exception as e:  # noqa: BLE001 - every Ray/env error becomes this slot's failure
                    out[i] = (False, _describe(ray, e))
        for ref in pending:
            out[by_ref[ref]] = (False, f"worker timed out: no answer within {timeout_s if limit_s is None else limit_s:g} s")
        return out

    def _submit(self, i: int, cmd: str, arg: Any) -> tuple[Any, str | None]:
        return getattr(self._slots[i].actor, cmd).remote(arg), None

    def _check_task(self, i: int, task: Any) -> None:
        if not isinstance(task, TaskSpec):
            raise TypeError(f"reset_batch: task for slot {i} must be a TaskSpec or None; got {type(task).__name__}")

    # ---- beyond the batch API ------------------------------------------------------------------
    def _lose(self, i: int, reason: str) -> None:
        """The actor of slot ``i`` died or hung outside step_batch: kill it, keep the episode open to report it."""
        s = self._slots[i]
        self.failures.append((i, reason))
        if s.actor is not None:
            try:
                self._ray.kill(s.actor, no_restart=True)
            except Exception:  # noqa: BLE001
                pass
        s.actor, s.pid, s.healthy = None, None, False
        if s.active:
            s.lost = reason
        else:
            s.lost = None

    def call(self, slot: int, method: str, *args: Any) -> Any:
        """Call ``env.<method>(*args)`` in a slot's actor (e.g. ``expert_action``); errors raise EnvPoolError."""
        self._check_open()
        return self._call_many({slot: (method, args)}, raise_errors=True)[slot]

    def _call_many(self, calls: dict[int, tuple[str, tuple]], raise_errors: bool) -> dict[int, Any]:
        out: dict[int, Any] = {}
        refs = {}
        for i, (method, args) in calls.items():
            if not 0 <= i < self.num_envs:
                raise IndexError(f"slot {i} out of range (num_envs={self.num_envs})")
            s = self._slots[i]
            if not s.healthy:
                if s.active:  # its episode is lost; the next step reports it
                    if raise_errors:
                        raise EnvPoolError(f"slot {i}: its actor was lost ({s.lost}); reset the slot")
                    out[i] = None
                    continue
                self._restart(i)
                if not s.healthy:
                    if raise_errors:
                        raise EnvPoolError(f"slot {i}: actor could not be started")
                    out[i] = None
                    continue
            refs[i] = s.actor.call.remote(method, tuple(args))
        for i, (ok, payload) in self._wait(refs, self.reset_timeout_s).items():
            if ok:
                out[i] = payload
                continue
            if not payload.startswith("env error"):
                self._lose(i, payload)
            if raise_errors:
                raise EnvPoolError(f"slot {i}: {calls[i][0]}: {payload}")
            out[i] = None
        return out

    def expert_actions(self) -> list[str | None]:
        """Each running slot's expert action, asked of all actors at once (None for idle slots, envs without an
        expert, or on failure)."""
        self._check_open()
        calls = {i: ("expert_action", ()) for i, s in enumerate(self._slots) if s.active and s.lost is None}
        got = self._call_many(calls, raise_errors=False)
        return [got.get(i) for i in range(self.num_envs)]

    def actor(self, slot: int) -> Any:
        """The Ray actor handle of a slot (None while it has none)."""
        return self._slots[slot].actor

    def worker_pid(self, slot: int) -> int | None:
        """The process id of a slot's actor (on its node)."""
        return self._slots[slot].pid

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        live = {i: s.actor.close.remote() for i, s in enumerate(self._slots) if s.healthy and s.actor is not None}
        if live:
            self._wait(live, 5.0)
        for i in range(self.num_envs):
            self._kill(i)
        if self._parse_env is not None:
            self._parse_env.close()


__all__ = ["RayEnvPool", "import_ray", "INSTALL_HINT"]
