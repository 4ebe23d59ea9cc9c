"""The collector engine: step records, collective aggregation, in-flight state, actions.

Integrations (``collector/integrations/``) and the facade call into one ``Client``. Every
public method is safe to call from any thread and never raises into user code.

Step records are emitted lazily: a step that ended stays *pending* until the next step
starts (or a heartbeat finds it stale), so ``vigil.log(loss=…)`` written after the
``with vigil.step(n)`` block still lands on step ``n``, as in DESIGN.md's example.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from collector.actions import ActionHandler, ActionRunner
from collector.chaos import Chaos
from collector.config import Config
from collector.transport import HttpTransport
from collector.worker import Event, Worker

log = logging.getLogger("vigil.collector")

STEP_FIELDS = ("loss", "grad_norm", "tokens")


@dataclass
class _Step:
    step: int
    started: float  # perf_counter
    ts: float = 0.0  # wall clock at the end
    duration_s: float = 0.0
    comm_s: float = 0.0
    data_s: float = 0.0
    mem_bytes: int | None = None
    opseq: str | None = None
    fields: dict[str, float] = field(default_factory=dict)
    ended_at: float = 0.0  # monotonic, for staleness


@dataclass
class Collective:
    """One collective call in flight; returned by ``collective_begin``."""

    group: str
    op: str
    seq: int
    nbytes: int
    since: float  # wall clock
    started: float  # perf_counter
    step: int | None
    members: list[int] | None = None
    # Point-to-point ops: the global ranks on the other side whose transfer has not
    # finished (``()``: a receive from any source); None for a collective.
    peers: tuple[int, ...] | None = None
    # Async work that completes only when waited on (gloo p2p) while no thread waits on it:
    # the rank is not blocked in it, so the heartbeat does not report it.
    parked: bool = False


class StepListener:
    """Integrations that need step boundaries (e.g. op-sequence capture) subclass this.
    Both methods run on the training thread, outside the client's lock."""

    def on_step_start(self, step: int) -> None:
        pass

    def on_step_end(self, step: int) -> None:
        pass


class Client:
    def __init__(self, config: Config, *, transport: HttpTransport | None = None) -> None:
        self.config = config
        self.chaos = Chaos.parse(config.chaos, rank=config.rank)
        self._lock = threading.Lock()
        self._current: _Step | None = None
        self._pending: _Step | None = None
        self._next_step = 0
        self._explicit_steps = False
        self._data_carry = 0.0
        self._listeners: list[StepListener] = []
        self._said_goodbye = False
        self._step_thread: int | None = None
        self._rss = rss_bytes()  # refreshed by every heartbeat tick
        self._cuda_capacity: int | None = None  # read once, on the training thread
        self._agg: dict[tuple[str, str, int | None], list[Any]] = {}
        self._inflight: dict[int, Collective] = {}
        self._seq: dict[str, int] = {}
        self._members: dict[str, list[int] | None] = {}
        self.actions = ActionRunner(self)
        transport = transport or HttpTransport(
            config.endpoint or "", config.token, config.timeout_s
        )
        self.worker = Worker(config, transport, tick=self._tick, on_actions=self.actions.dispatch)
        # Registered after the worker's own hook, so it runs first (atexit is LIFO) and
        # the last step record is queued before the worker's final flush.
        atexit.register(self._atexit)
        self._send_plan()

    # -- steps -------------------------------------------------------------------------

    def add_step_listener(self, listener: StepListener) -> None:
        self._listeners.append(listener)

    def begin_step(self, n: int) -> None:
        self._explicit_steps = True
        unfinished = self.current_step
        if unfinished is not None:
            self._notify_end(unfinished)
        with self._lock:
            if self._current is not None:  # an unfinished step: close it first
                self._end_locked()
            self._emit_pending_locked()
            self._start_locked(n)
        self._notify_start(n)

    def end_step(self) -> None:
        n = self.current_step
        if n is None:
            return
        self._notify_end(n)
        with self._lock:
            self._end_locked()

    def _start_locked(self, n: int) -> None:
        self._step_thread = threading.get_ident()
        self._current = _Step(step=n, started=time.perf_counter(), data_s=self._data_carry)
        self._data_carry = 0.0

    def _notify_start(self, n: int) -> None:
        self.chaos.at_step_start(n)
        for listener in self._listeners:
            try:
                listener.on_step_start(n)
            except Exception:
                log.debug("vigil: step listener failed", exc_info=True)

    def _notify_end(self, n: int) -> None:
        for listener in self._listeners:
            try:
                listener.on_step_end(n)
            except Exception:
                log.debug("vigil: step listener failed", exc_info=True)
        self.chaos.at_step_end(n)

    def tick_optimizer_step(self) -> None:
        """After every ``optimizer.step()``, for scripts that do not mark steps: the step
        that just ended closes and the next one starts. The first call only starts step 0,
        so setup time is never counted as a step."""
        if self._explicit_steps:
            return
        ending = self.current_step
        if ending is not None:
            self._notify_end(ending)
        n = self._next_step
        self._next_step = n + 1
        with self._lock:
            self._end_locked()
            self._emit_pending_locked()
            self._start_locked(n)
        self._notify_start(n)

    def _end_locked(self) -> None:
        cur = self._current
        if cur is None:
            return
        now = time.perf_counter()
        cur.duration_s = now - cur.started
        cur.ts = time.time()
        cur.ended_at = time.monotonic()
        # CUDA peak per step (no I/O); off GPU the RSS the heartbeat thread last read, so
        # the training thread never opens /proc on its step path.
        peak = cuda_peak_bytes()
        cur.mem_bytes = peak if peak is not None else self._rss
        if peak is not None and self._cuda_capacity is None:
            self._cuda_capacity = cuda_capacity_bytes()
        self._pending, self._current = cur, None
        self._flush_collectives_locked(cur.step)

    def _emit_pending_locked(self) -> None:
        p = self._pending
        if p is None:
            return
        self._pending = None
        event: Event = {
            "type": "step",
            "step": p.step,
            "ts": p.ts,
            "duration_s": p.duration_s,
            "comm_s": p.comm_s,
            "data_s": p.data_s,
        }
        if p.mem_bytes is not None:
            event["mem_bytes"] = p.mem_bytes
        if p.opseq is not None:
            event["opseq"] = p.opseq
        event.update(p.fields)
        self.worker.submit(event)

    @property
    def current_step(self) -> int | None:
        cur = self._current
        return cur.step if cur is not None else None

    # -- metrics -----------------------------------------------------------------------

    def log(self, step: int | None = None, **metrics: Any) -> None:
        with self._lock:
            target = self._current or self._pending
            if step is not None and target is not None and target.step != step:
                target = None
            for name, raw in metrics.items():
                value = to_float(raw)
                if value is None:
                    self.worker.drop("bad_metric")
                    continue
                if target is not None and name in STEP_FIELDS:
                    target.fields[name] = int(value) if name == "tokens" else value
                else:
                    at = step if step is not None else (target.step if target else None)
                    event: Event = {
                        "type": "metric",
                        "name": name,
                        "value": value,
                        "ts": time.time(),
                    }
                    if at is not None:
                        event["step"] = at
                    self.worker.submit(event)

    def add_data_wait(self, seconds: float) -> None:
        """Time spent waiting for input; outside a step it counts towards the next one
        (``for batch in loader: with vigil.step(n): …`` fetches before the step starts)."""
        cur = self._current
        if cur is not None:
            cur.data_s += seconds
        else:
            self._data_carry += seconds

    def set_step_fields(self, **fields: Any) -> None:
        """Fields for the step being timed, sent with its record; they take precedence over
        what the client measured (the swap executor's ``mem_bytes``; None: unknown).
        Called by step listeners, on the training thread, before the step ends."""
        cur = self._current
        if cur is not None:
            cur.fields.update(fields)

    def set_opseq(self, fingerprint: str) -> None:
        cur = self._current
        if cur is not None:
            cur.opseq = fingerprint

    def event(self, name: str, **attrs: Any) -> None:
        ev: Event = {"type": "event", "name": name, "ts": time.time(), "attrs": attrs}
        step = self.current_step
        if step is not None:
            ev["step"] = step
        self.worker.submit(ev)

    def _send_plan(self) -> None:
        """The run's planned length, once (``Config.total_steps``; ignored unless > 0)."""
        total = self.config.total_steps
        if isinstance(total, int) and not isinstance(total, bool) and total > 0:
            plan: Event = {"type": "event", "name": "run_plan", "ts": time.time()}
            plan["attrs"] = {"total_steps": total}
            self.worker.submit(plan)

    def submit(self, event: Event) -> None:
        self.worker.submit(event)

    # -- collectives -------------------------------------------------------------------

    def collective_begin(
        self,
        group: str,
        op: str,
        nbytes: int,
        members: list[int] | None = None,
        peers: tuple[int, ...] | None = None,
    ) -> Collective:
        """Record a call entering ``group``. Collectives number the group's sequence; a
        point-to-point op (``peers`` given) does not advance it and carries the number of
        collectives before it (as Flight Recorder does), so ranks that exchanged different
        numbers of messages on a group agree on the seq of its next collective."""
        with self._lock:
            seq = self._seq.get(group, 0) + (1 if peers is None else 0)
            self._seq[group] = seq
            self._members.setdefault(group, members)
            call = Collective(
                group,
                op,
                seq,
                nbytes,
                time.time(),
                time.perf_counter(),
                self.current_step,
                members,
                peers,
            )
            self._inflight[id(call)] = call
        return call

    def collective_end(self, call: Collective, duration_s: float | None = None) -> None:
        if duration_s is None:
            duration_s = time.perf_counter() - call.started
        if self.chaos:
            duration_s += self.chaos.collective_delay(duration_s)
        with self._lock:
            self._inflight.pop(id(call), None)
            key = (call.group, call.op, call.step)
            agg = self._agg.get(key)
            if agg is None:
                self._agg[key] = [1, call.nbytes, duration_s, call.seq]
            else:
                agg[0] += 1
                agg[1] += call.nbytes
                agg[2] += duration_s
                agg[3] = max(agg[3], call.seq)
            cur = self._current
            if cur is not None and call.step == cur.step:
                cur.comm_s += duration_s

    def _flush_collectives_locked(self, step: int | None) -> None:
        """Emit aggregates of ``step`` (and of calls outside any step)."""
        for key in [k for k in self._agg if k[2] == step or k[2] is None]:
            count, nbytes, duration, seq = self._agg.pop(key)
            group, op, at = key
            event: Event = {
                "type": "collective",
                "group": group,
                "op": op,
                "seq": seq,
                "bytes": nbytes,
                "duration_s": duration,
                "count": count,
            }
            if at is not None:
                event["step"] = at
            members = self._members.get(group)
            if members is not None:
                event["members"] = members
            self.worker.submit(event)

    def inflight(self) -> Collective | None:
        """The oldest collective this rank is inside right now (parked work left out)."""
        with self._lock:
            calls = [c for c in self._inflight.values() if not c.parked]
        return min(calls, key=lambda c: c.started) if calls else None

    # -- heartbeat (worker thread) -----------------------------------------------------

    def _tick(self) -> list[Event]:
        self._rss = rss_bytes() or self._rss
        if self._said_goodbye:
            return []  # a later heartbeat would undo the goodbye
        with self._lock:
            p = self._pending
            if p is not None and time.monotonic() - p.ended_at > self.config.flush_s:
                self._emit_pending_locked()
            cur = self._current
            step = cur.step if cur is not None else (p.step + 1 if p is not None else None)
        beat: Event = {"type": "heartbeat", "ts": time.time(), "pid": os.getpid()}
        if step is not None:
            beat["step"] = step
        call = self.inflight()
        if call is not None:
            inflight: dict[str, Any] = {
                "group": call.group,
                "op": call.op,
                "seq": call.seq,
                "since": call.since,
            }
            if call.peers is not None:
                inflight["peers"] = sorted(set(call.peers))
            beat["inflight"] = inflight
        dropped = self.worker.drops()
        if dropped:
            beat["dropped"] = dropped
        capacity = self.config.memory_budget_bytes or self._cuda_capacity
        if capacity is not None:
            beat["mem_capacity"] = capacity
        beat["swap"] = self.config.swap
        return [beat]

    # -- actions -----------------------------------------------------------------------

    def register_action(self, kind: str, handler: ActionHandler) -> None:
        self.actions.register(kind, handler)

    # -- lifecycle ---------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Delivery counters: see ``collector.stats``."""
        return self.worker.stats()

    def flush(self, timeout: float | None = None) -> bool:
        with self._lock:
            if self._current is None:
                self._emit_pending_locked()
            self._flush_collectives_locked(None)
        return self.worker.flush(timeout if timeout is not None else self.config.timeout_s)

    def _atexit(self) -> None:
        try:
            self.shutdown()
        except Exception:
            log.debug("vigil: error while flushing at exit", exc_info=True)

    def shutdown(self, timeout: float | None = None, *, exit_code: int | None = None) -> None:
        """Send what is left and say goodbye (``exiting``), with the process's exit code
        when it is known: ``exit_code``, or 1 after an uncaught exception (the server
        tells a finished run from a failed one by it: ``backend.jobs.runs``)."""
        unfinished = self.current_step
        # Listeners (the op-sequence capture) undo thread-local state: only on the thread
        # that runs the steps, not on an action thread that exits for a restart.
        if unfinished is not None and threading.get_ident() == self._step_thread:
            self._notify_end(unfinished)
        with self._lock:
            if self._current is not None:
                if threading.get_ident() == self._step_thread:
                    self._end_locked()
                else:
                    # Another thread is ending the process (an exit for restart) while the
                    # training thread is inside a step: that step never finished, so it is
                    # not reported as one (it would pass for progress the job never made).
                    self._current = None
            self._emit_pending_locked()
            self._flush_collectives_locked(None)
        if not self._said_goodbye:
            goodbye = self._tick()[0]
            self._said_goodbye = True
            goodbye["exiting"] = True  # an exit the collector saw, not a crash
            code = exit_code if exit_code is not None else _uncaught_exit_code()
            if code is not None:
                goodbye["exit_code"] = code
            self.worker.submit(goodbye)
        self.worker.shutdown(timeout)


def _uncaught_exit_code() -> int | None:
    """1 when the interpreter is exiting on an uncaught exception (it sets
    ``sys.last_value`` before the exit handlers run), else None (not known)."""
    return 1 if getattr(sys, "last_value", None) is not None else None


def to_float(value: Any) -> float | None:
    """A metric value as float: numbers, 0-d tensors (``.item()``), numpy scalars."""
    try:
        if hasattr(value, "item"):
            value = value.item()
        out = float(value)
    except (TypeError, ValueError, RuntimeError):
        return None
    return out if not isinstance(out, bool) else float(out)


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def cuda_peak_bytes() -> int | None:
    """Peak CUDA allocator memory since the last call (resets the peak), or None off GPU."""
    torch = _torch_if_loaded()
    if torch is not None:
        try:
            if torch.cuda.is_available() and torch.cuda.is_initialized():
                peak = int(torch.cuda.max_memory_allocated())
                torch.cuda.reset_peak_memory_stats()
                return peak
        except Exception:
            pass
    return None


def cuda_capacity_bytes() -> int | None:
    """Total memory of the current CUDA device (the calling thread's), or None."""
    torch = _torch_if_loaded()
    try:
        return int(torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory)
    except Exception:
        return None


def rss_bytes() -> int | None:
    """Current process RSS (Linux). Reads /proc, so it runs on the worker thread."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


def _torch_if_loaded() -> Any:
    import sys

    return sys.modules.get("torch")
