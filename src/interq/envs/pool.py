"""Environments in worker processes, stepped as a batch, surviving crashes and hangs.

``EnvPool`` runs one environment per slot, each in its own process (``multiprocessing`` with
``spawn`` by default, or ``forkserver``), and steps all slots at once:

    pool = EnvPool.from_name("household", num_envs=8, step_timeout_s=30, split_sizes={"train": 100})
    obs = pool.reset_batch(tasks)                     # one TaskSpec (or None: idle) per slot
    results = pool.step_batch(actions)                # one action (or None: skip) per slot
    ticket = pool.step_submit(actions)                # or in two halves: send, do other work, then
    results = pool.step_collect(ticket)               # wait (disjoint slots may have tickets out together)
    pool.close()

Scripts that build a pool must guard their entry point with ``if __name__ == "__main__":`` (``spawn``
and ``forkserver`` re-import the main module in each worker).

Failure handling (the affected episode is reported as failed, never silently dropped):

- A worker that dies (killed, segfault, ``os._exit``) or does not answer a step within
  ``step_timeout_s`` is killed; that slot's result is a :class:`StepResult` with ``truncated=True``,
  ``terminated=False``, reward 0, ``info["failure"] = "worker died: ..."`` / ``"worker timed out: ..."``
  and ``info["won"] = False``. The other slots' results are returned as usual. The slot's worker is
  restarted (lazily, at its next ``reset_batch``) and ``restarts[slot]`` counts it.
- An exception raised inside the environment's ``step`` is reported the same way
  (``info["failure"] = "env error: <Type>: <message>"``) and the worker is restarted.
- ``reset_batch``: a slot whose reset fails is restarted and retried once (``reset_retries``); if it
  fails again, :class:`EnvPoolError` is raised after every other slot was reset, so the pool stays usable.
- Programming mistakes raise before anything is sent: a wrong number of actions, stepping a slot
  that has no running episode (never reset, or ended), a non-str action (:class:`EpisodeError` / TypeError).

``FaultInjectionEnv`` wraps any env factory and turns the actions ``__die__``, ``__hang__`` and
``__raise__`` into the three failures, for testing code that uses the pool.
"""

from __future__ import annotations

import functools
import multiprocessing as mp
import os
import pickle
import signal
import time
import traceback
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection, wait
from typing import Any

from .base import Env, EpisodeError, Observation, ParsedAction, StepResult, TaskSpec


class EnvPoolError(RuntimeError):
    """A slot could not be brought up or reset even after a restart."""


class StepTicket:
    """Steps sent by :meth:`BatchPool.step_submit`, not yet collected: the transport's handles per slot, the slots
    that failed before anything was sent (reason), the submit time (the step timeout counts from it)."""

    def __init__(self, handles: dict[int, Any], failed: dict[int, str], submitted: float) -> None:
        self.handles, self.failed, self.submitted = handles, failed, submitted
        self.collected = False


class SlotState:
    """What the batch API knows of a slot, whatever carries its messages."""

    def __init__(self) -> None:
        self.task: TaskSpec | None = None
        self.active = False     # an episode is running (reset done, not ended)
        self.healthy = False    # the worker is up and answering
        self.lost: str | None = None  # RayEnvPool only: the episode's worker was lost outside step_batch


class BatchPool:
    """The batch API that :class:`EnvPool` (worker processes) and :class:`~interq.envs.ray_pool.RayEnvPool` (Ray
    actors) share: argument checks, the reset retries, failure results, the bookkeeping of restarts and failures.

    A subclass carries the messages. It sets up its transport, then calls :meth:`_setup`, and provides:

    - ``_start(slots)``: start a worker for each slot and wait until it is ready (``healthy``) or failed (``_fail``);
    - ``_kill(i)``: stop slot ``i``'s worker (no longer healthy nor active);
    - ``_submit(i, cmd, arg) -> (handle, error)``: send ``("reset", task)`` or ``("step", action)`` to slot ``i``'s
      worker; ``error`` (a failure reason) when it could not be sent;
    - ``_wait(handles, timeout_s, limit_s=None) -> {slot: (ok, result or failure reason)}``: the answers of
      ``{slot: handle}``, never blocking past ``timeout_s`` (answers already in are taken even at 0 s); reasons
      start with ``worker died``, ``worker timed out`` (naming ``limit_s``, the whole allowance, when given) or
      ``env error``.
    """

    _unit = "workers"   # what the start failure calls them

    def _setup(self, env_fn: Callable[[], Env], num_envs: int, step_timeout_s: float, reset_timeout_s: float | None,
               start_timeout_s: float, reset_retries: int, slot: Callable[[], SlotState]) -> None:
        """Record the settings, start every slot's worker; EnvPoolError (pool closed) if any fails to start."""
        self.env_fn = env_fn
        self.num_envs = num_envs
        self.step_timeout_s = float(step_timeout_s)
        self.reset_timeout_s = float(reset_timeout_s if reset_timeout_s is not None else max(step_timeout_s, 60.0))
        self.start_timeout_s = float(start_timeout_s)
        self.reset_retries = int(reset_retries)
        self._slots = [slot() for _ in range(num_envs)]
        self.restarts = [0] * num_envs
        self.failures: list[tuple[int, str]] = []   # (slot, reason), in order
        self._parse_env: Env | None = None
        self._pending_slots: set[int] = set()  # slots in a step_submit ticket not yet collected
        self._closed = False
        self._start(list(range(num_envs)))
        bad = [i for i in range(num_envs) if not self._slots[i].healthy]
        # a worker that died before it could say why (its process lost under load: no build error, no timeout) gets
        # one more start; an env that cannot be built or a start that timed out fails at once
        lost = [i for i in bad if self._lost_at_start(i)]
        if lost:
            for i in lost:
                self.restarts[i] += 1
            self._start(lost)
            bad = [i for i in range(num_envs) if not self._slots[i].healthy]
        if bad:
            reasons = [r for s, r in self.failures if s in bad]
            self.close()
            raise EnvPoolError(f"{self._unit} {bad} failed to start: {reasons[:1]}")

    def _lost_at_start(self, i: int) -> bool:
        reasons = [r for s, r in self.failures if s == i]
        last = reasons[-1] if reasons else ""
        return last.startswith("worker failed to start: worker died") and "could not be built" not in last

    # ---- transport hooks (see the class docstring) -----------------------------------------------
    def _start(self, slots: list[int]) -> None:
        raise NotImplementedError

    def _kill(self, i: int) -> None:
        raise NotImplementedError

    def _submit(self, i: int, cmd: str, arg: Any) -> tuple[Any, str | None]:
        raise NotImplementedError

    def _wait(self, handles: dict[int, Any], timeout_s: float, limit_s: float | None = None) -> dict[int, tuple[bool, Any]]:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def _check_task(self, i: int, task: Any) -> None:
        """A task ``reset_batch`` refuses before sending anything (EnvPool passes anything on to the env)."""

    # ---- shared bookkeeping ----------------------------------------------------------------------
    def _fail(self, i: int, reason: str) -> None:
        self.failures.append((i, reason))
        self._kill(i)

    def _restart(self, i: int) -> None:
        self._kill(i)
        self.restarts[i] += 1
        self._start([i])

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"{type(self).__name__} is closed")

    # ---- the batch API ---------------------------------------------------------------------------
    def reset_batch(self, tasks: Sequence[TaskSpec | None]) -> list[Observation | None]:
        """Start an episode of ``tasks[i]`` in slot ``i`` (None leaves the slot idle, its episode dropped)."""
        self._check_open()
        if self._pending_slots:
            raise EpisodeError(f"reset_batch: slots {sorted(self._pending_slots)} are still stepping (collect their "
                               "tickets first)")
        if len(tasks) > self.num_envs:
            raise ValueError(f"reset_batch: got {len(tasks)} tasks for {self.num_envs} slots")
        for i, t in enumerate(tasks):
            if t is not None:
                self._check_task(i, t)
        tasks = list(tasks) + [None] * (self.num_envs - len(tasks))
        out: list[Observation | None] = [None] * self.num_envs
        for s in self._slots:  # every episode ends here: a slot with a task is active again once reset
            s.active, s.lost = False, None
        errors: list[str] = []
        todo = [i for i, t in enumerate(tasks) if t is not None]
        for attempt in range(self.reset_retries + 1):
            for i in todo:
                if not self._slots[i].healthy:
                    self._restart(i)
            failed = {i: "worker could not be restarted" for i in todo if not self._slots[i].healthy}
            handles = self._submit_all("reset", {i: tasks[i] for i in todo if i not in failed}, failed)
            for i, (ok, payload) in self._wait(handles, self.reset_timeout_s).items():
                if ok:
                    out[i] = payload
                    self._slots[i].task, self._slots[i].active = tasks[i], True
                else:
                    failed[i] = payload
            for i, reason in failed.items():
                self._fail(i, f"reset of {tasks[i].task_id!r}: {reason}")
            todo = sorted(failed)
            if not todo:
                break
            if attempt == self.reset_retries:
                errors = [f"slot {i} ({tasks[i].task_id}): {failed[i]}" for i in todo]
        if errors:
            raise EnvPoolError("reset failed after restart: " + "; ".join(errors))
        return out

    def step_batch(self, actions: Sequence[str | None]) -> list[StepResult | None]:
        """Step every slot whose action is not None; returns a result per slot (None where skipped)."""
        return self.step_collect(self.step_submit(actions))

    def step_submit(self, actions: Sequence[str | None]) -> "StepTicket":
        """The first half of :meth:`step_batch`: send the actions and return at once, while the workers step.

        Pass the ticket to :meth:`step_collect` for the results. Several tickets may be out at a time over disjoint
        slots (the agent loop steps one half of a wave while it generates for the other half); a slot already in
        an outstanding ticket cannot be stepped again until that ticket is collected (EpisodeError)."""
        self._check_open()
        if len(actions) != self.num_envs:
            raise ValueError(f"step_batch: expected {self.num_envs} actions (None to skip a slot); got {len(actions)}")
        pending = self._pending_slots
        for i, a in enumerate(actions):
            if a is None:
                continue
            if not isinstance(a, str):
                raise TypeError(f"step_batch: action for slot {i} must be a str or None; got {type(a).__name__}")
            if not self._slots[i].active:
                raise EpisodeError(f"step_batch: slot {i} has no running episode (never reset, or it ended); "
                                   "reset it or pass None")
            if i in pending:
                raise EpisodeError(f"step_submit: slot {i} is still stepping (collect its ticket first)")
        # a slot whose worker was lost earlier is reported here, with the reason recorded then
        failed = {i: self._slots[i].lost for i, a in enumerate(actions)
                  if a is not None and self._slots[i].lost is not None}
        handles = self._submit_all("step", {i: a for i, a in enumerate(actions)
                                            if a is not None and i not in failed}, failed)
        ticket = StepTicket(handles, failed, time.monotonic())
        self._pending_slots = pending | set(handles) | set(failed)
        return ticket

    def step_collect(self, ticket: "StepTicket") -> list[StepResult | None]:
        """The second half of :meth:`step_batch`: wait for the ticket's answers (a worker gets ``step_timeout_s``
        from the submit) and return a result per slot (None where skipped), failures as in :meth:`step_batch`."""
        self._check_open()
        if ticket.collected:
            raise EpisodeError("step_collect: this ticket was already collected")
        ticket.collected = True
        self._pending_slots = self._pending_slots - set(ticket.handles) - set(ticket.failed)
        out: list[StepResult | None] = [None] * self.num_envs
        failed = dict(ticket.failed)
        left = max(0.0, self.step_timeout_s - (time.monotonic() - ticket.submitted))
        for i, (ok, payload) in self._wait(ticket.handles, left, self.step_timeout_s).items():
            if ok:
                out[i] = payload
                if payload.terminated or payload.truncated:
                    self._slots[i].active = False
            else:
                failed[i] = payload
        for i, reason in sorted(failed.items()):
            task = self._slots[i].task
            if self._slots[i].lost is None:
                self._fail(i, reason)
            else:
                self._kill(i)   # already recorded in failures when it was lost
            out[i] = self.failure_result(task, reason)
        return out

    def _submit_all(self, method: str, args: dict[int, Any], failed: dict[int, str]) -> dict[int, Any]:
        """Submit ``method(args[i])`` to each slot i; returns the handles, and records submit errors in ``failed``."""
        handles: dict[int, Any] = {}
        for i, arg in args.items():
            handle, err = self._submit(i, method, arg)
            if err:
                failed[i] = err
            else:
                handles[i] = handle
        return handles

    @staticmethod
    def failure_result(task: TaskSpec | None, reason: str) -> StepResult:
        """The result reported for an episode lost to a worker failure."""
        obs = Observation(text=f"[environment failure: {reason}]", admissible_actions=None, anchor="", task=task)
        return StepResult(obs, 0.0, terminated=False, truncated=True,
                          info={"won": False, "valid_action": False, "failure": reason})

    def call(self, slot: int, method: str, *args: Any) -> Any:
        raise NotImplementedError

    def tasks(self, split: str) -> list[TaskSpec]:
        return self.call(0, "tasks", split)

    def parse_action(self, generated_text: str) -> ParsedAction:
        """The env's pure ``parse_action``, run in this process (one local env, built on first use)."""
        if self._parse_env is None:
            self._parse_env = self.env_fn()
        return self._parse_env.parse_action(generated_text)

    @property
    def active(self) -> list[bool]:
        return [s.active for s in self._slots]

    def __enter__(self):
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:
            pass


def _worker_main(conn: Connection, env_fn: Callable[[], Env]) -> None:  # runs in the child process
    try:
        env = env_fn()
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        conn.send(("error", f"could not build env: {type(e).__name__}: {e}\n{traceback.format_exc()}"))
        return
    conn.send(("ok", "ready"))
    while True:
        try:
            cmd, arg = conn.recv()
        except (EOFError, OSError):
            return
        try:
            if cmd == "reset":
                out = env.reset(arg)
            elif cmd == "step":
                out = env.step(arg)
            elif cmd == "call":
                name, args = arg
                out = getattr(env, name)(*args)
            elif cmd == "close":
                try:
                    env.close()
                finally:
                    conn.send(("ok", None))
                return
            else:
                raise ValueError(f"unknown worker command {cmd!r}")
            conn.send(("ok", out))
        except BaseException as e:  # noqa: BLE001
            conn.send(("error", f"{type(e).__name__}: {e}"))


class _Slot(SlotState):
    def __init__(self) -> None:
        super().__init__()
        self.proc: mp.process.BaseProcess | None = None
        self.conn: Connection | None = None


class EnvPool(BatchPool):
    """A batch of environments in worker processes (see the module docstring).

    Args:
        env_fn: picklable zero-argument callable returning an Env (e.g.
            ``functools.partial(make_env, "household", max_steps=50)``); see :meth:`from_name`.
        num_envs: number of slots (worker processes).
        step_timeout_s: a step that takes longer fails its slot (the worker is killed and restarted).
        reset_timeout_s: same for reset and other calls (default: max(step_timeout_s, 60)).
        start_timeout_s: time a new worker has to build its env.
        start_method: "spawn" (default) or "forkserver".
        reset_retries: restarts tried for a slot whose reset fails before EnvPoolError.
    """

    def __init__(self, env_fn: Callable[[], Env], num_envs: int, step_timeout_s: float = 60.0,
                 reset_timeout_s: float | None = None, start_timeout_s: float = 120.0, start_method: str = "spawn",
                 reset_retries: int = 1):
        if not isinstance(num_envs, int) or num_envs < 1:
            raise ValueError(f"num_envs must be a positive int; got {num_envs!r}")
        if start_method not in ("spawn", "forkserver"):
            raise ValueError(f"start_method must be 'spawn' or 'forkserver'; got {start_method!r}")
        if not step_timeout_s > 0:
            raise ValueError(f"step_timeout_s must be > 0; got {step_timeout_s!r}")
        try:
            pickle.dumps(env_fn)
        except Exception as e:
            raise TypeError("env_fn must be picklable (a module-level function or functools.partial, e.g. "
                            f"EnvPool.from_name(name, ...)); pickling failed: {e}") from None
        self._ctx = mp.get_context(start_method)
        self._setup(env_fn, num_envs, step_timeout_s, reset_timeout_s, start_timeout_s, reset_retries, _Slot)

    @classmethod
    def from_name(cls, name: str, num_envs: int, step_timeout_s: float = 60.0, start_method: str = "spawn",
                  **env_kwargs: Any) -> "EnvPool":
        """A pool of ``make_env(name, **env_kwargs)``."""
        from . import make_env
        return cls(functools.partial(make_env, name, **env_kwargs), num_envs, step_timeout_s=step_timeout_s,
                   start_method=start_method)

    # ---- process management --------------------------------------------------------------------
    def _start(self, slots: list[int]) -> None:
        """Start workers for ``slots`` in parallel and wait until each is ready (or failed)."""
        for i in slots:
            s = self._slots[i]
            parent, child = self._ctx.Pipe()
            proc = self._ctx.Process(target=_worker_main, args=(child, self.env_fn), daemon=True,
                                     name=f"interq-env-{i}")
            proc.start()
            child.close()
            s.proc, s.conn, s.healthy, s.active = proc, parent, False, False
        results = self._wait({i: self._slots[i] for i in slots}, self.start_timeout_s)
        for i, (ok, payload) in results.items():
            if ok:
                self._slots[i].healthy = True
            else:
                self._fail(i, f"worker failed to start: {payload}")

    def _kill(self, i: int) -> None:
        s = self._slots[i]
        if s.proc is not None and s.proc.is_alive():
            try:
                os.kill(s.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):  # pragma: no cover
                pass
        if s.proc is not None:
            s.proc.join(timeout=5)
        if s.conn is not None:
            s.conn.close()
        s.proc, s.conn, s.healthy, s.active = None, None, False, False

    def _wait(self, slots: dict[int, _Slot], timeout_s: float, limit_s: float | None = None) -> dict[int, tuple[bool, Any]]:
        """Wait for one reply from each slot. Returns {slot: (ok, payload or reason)}; never blocks past timeout."""
        out: dict[int, tuple[bool, Any]] = {}
        deadline, polled = time.monotonic() + timeout_s, False
        pending = dict(slots)
        while pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0 and polled:
                break
            remaining, polled = max(remaining, 0.0), True  # answers already in are taken even when no time is left
            by_conn = {s.conn: i for i, s in pending.items()}
            by_sentinel = {s.proc.sentinel: i for i, s in pending.items()}
            ready = wait(list(by_conn) + list(by_sentinel), timeout=remaining)
            for obj in ready:
                i = by_conn.get(obj, by_sentinel.get(obj))
                if i not in pending:
                    continue
                s = pending[i]
                try:
                    if s.conn.poll():
                        status, payload = s.conn.recv()
                        out[i] = (status == "ok", payload if status == "ok" else f"env error: {payload}")
                        del pending[i]
                        continue
                except (EOFError, OSError):
                    pass
                if not s.proc.is_alive():
                    s.proc.join(timeout=1)
                    out[i] = (False, f"worker died: exit code {s.proc.exitcode}")
                    del pending[i]
        for i in pending:
            out[i] = (False, f"worker timed out: no answer within {timeout_s if limit_s is None else limit_s:g} s")
        return out

    def _send(self, i: int, msg: tuple) -> str | None:
        s = self._slots[i]
        try:
            s.conn.send(msg)
            return None
        except (BrokenPipeError, OSError, ValueError) as e:
            return f"worker died: {type(e).__name__}: {e}"

    def _submit(self, i: int, cmd: str, arg: Any) -> tuple[Any, str | None]:
        err = self._send(i, (cmd, arg))
        return (None, err) if err else (self._slots[i], None)

    # ---- beyond the batch API ------------------------------------------------------------------
    def call(self, slot: int, method: str, *args: Any) -> Any:
        """Call ``env.<method>(*args)`` in a slot's worker (e.g. ``expert_action``); errors raise EnvPoolError."""
        self._check_open()
        s = self._slots[slot]
        if not s.healthy:
            self._restart(slot)
        if not s.healthy:
            raise EnvPoolError(f"slot {slot}: worker could not be started")
        err = self._send(slot, ("call", (method, args)))
        if err:
            self._fail(slot, err)
            raise EnvPoolError(f"slot {slot}: {err}")
        ok, payload = self._wait({slot: s}, self.reset_timeout_s)[slot]
        if not ok:
            if not payload.startswith("env error"):
                self._fail(slot, payload)
            raise EnvPoolError(f"slot {slot}: {method}: {payload}")
        return payload

    def expert_actions(self) -> list[str | None]:
        """Each running slot's expert action (None for idle slots, envs without an expert, or on failure)."""
        out: list[str | None] = [None] * self.num_envs
        for i, s in enumerate(self._slots):
            if s.active:
                try:
                    out[i] = self.call(i, "expert_action")
                except EnvPoolError:
                    out[i] = None
        return out

    def worker_pid(self, slot: int) -> int | None:
        p = self._slots[slot].proc
        return p.pid if p is not None else None

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for i, s in enumerate(self._slots):
            if s.healthy and s.conn is not None:
                if self._send(i, ("close", None)) is None and s.conn.poll(2.0):
                    try:
                        s.conn.recv()
                    except (EOFError, OSError):
                        pass
            if s.proc is not None:
                s.proc.join(timeout=2)
            self._kill(i)
        if self._parse_env is not None:
            self._parse_env.close()


class FaultInjectionEnv:
    """Wraps an env factory; the actions ``__die__`` (SIGKILL itself), ``__hang__`` (sleep forever) and
    ``__raise__`` (RuntimeError) inject worker failures. Everything else is passed through.

    ``die_at_step`` / ``hang_at_step`` ({task_id: k}) inject the same failures at the k-th step (1-based) of an
    episode of that task, whatever the action (for failures in the middle of a policy's episodes)."""

    def __init__(self, env_fn: Callable[[], Env], die_at_step: dict[str, int] | None = None,
                 hang_at_step: dict[str, int] | None = None):
        self.inner = env_fn()
        self.name = self.inner.name
        self.die_at_step = dict(die_at_step or {})
        self.hang_at_step = dict(hang_at_step or {})
        self._task_id: str | None = None
        self._steps = 0

    def tasks(self, split: str) -> list[TaskSpec]:
        return self.inner.tasks(split)

    def reset(self, task: TaskSpec) -> Observation:
        if task.task_id.endswith("__die_on_reset__"):
            os.kill(os.getpid(), signal.SIGKILL)
        self._task_id, self._steps = task.task_id, 0
        return self.inner.reset(task)

    def step(self, action: str) -> StepResult:
        self._steps += 1
        if action == "__die__" or self.die_at_step.get(self._task_id) == self._steps:
            os.kill(os.getpid(), signal.SIGKILL)
        if action == "__hang__" or self.hang_at_step.get(self._task_id) == self._steps:
            while True:
                time.sleep(3600)
        if action == "__raise__":
            raise RuntimeError("injected fault")
        return self.inner.step(action)

    def parse_action(self, generated_text: str) -> ParsedAction:
        return self.inner.parse_action(generated_text)

    def expert_action(self) -> str | None:
        return getattr(self.inner, "expert_action", lambda: None)()

    def close(self) -> None:
        self.inner.close()


class LatencyEnv(FaultInjectionEnv):
    """Wraps an env factory; every ``step`` takes at least ``step_latency_s`` (the wrapped step, then a sleep for
    the rest), every ``reset`` at least ``reset_latency_s``. The results are the wrapped env's. A measuring
    instrument: the latency of a slow engine (ALFWorld 15-300 ms a step) without its CPU, so the overlap of
    environment steps with generation (``env.overlap``) can be measured on a machine busy with other work."""

    def __init__(self, env_fn: Callable[[], Env], step_latency_s: float = 0.0, reset_latency_s: float = 0.0):
        super().__init__(env_fn)
        if step_latency_s < 0 or reset_latency_s < 0:
            raise ValueError(f"latencies must be >= 0; got step {step_latency_s}, reset {reset_latency_s}")
        self.step_latency_s, self.reset_latency_s = float(step_latency_s), float(reset_latency_s)

    def reset(self, task: TaskSpec) -> Observation:
        t0 = time.monotonic()
        obs = super().reset(task)
        time.sleep(max(0.0, self.reset_latency_s - (time.monotonic() - t0)))
        return obs

    def step(self, action: str) -> StepResult:
        t0 = time.monotonic()
        res = super().step(action)
        time.sleep(max(0.0, self.step_latency_s - (time.monotonic() - t0)))
        return res


__all__ = ["BatchPool", "EnvPool", "EnvPoolError", "FaultInjectionEnv", "LatencyEnv", "SlotState"]
