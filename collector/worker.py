"""The background worker: a bounded queue drained by one daemon thread.

The training thread only ever calls ``submit`` (``put_nowait``; when the queue is full the
event is dropped and counted). The worker thread batches events by size or time, adds a
heartbeat every ``heartbeat_s``, ships with retries (same ``batch_id``, so the server stores
a retried batch once), honours ``Retry-After``, and hands actions from replies to a callback.
While the backend is unreachable, memory stays bounded: one batch in retry plus the queue.

It survives ``fork``: a child process gets a fresh queue and starts its own thread on
first use. At interpreter exit it flushes for at most ``exit_timeout_s``.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import queue
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

from collector.config import Config
from collector.transport import Backoff, HttpTransport, Outcome

log = logging.getLogger("vigil.collector")

Event = dict[str, Any]


class _Flush:
    def __init__(self) -> None:
        self.done = threading.Event()


_STOP = object()


class Worker:
    def __init__(
        self,
        config: Config,
        transport: HttpTransport,
        *,
        tick: Callable[[], list[Event]],
        on_actions: Callable[[list[dict[str, Any]]], None],
    ) -> None:
        self.config = config
        self.transport = transport
        self._tick = tick
        self._on_actions = on_actions
        self.dropped: Counter[str] = Counter()
        self.sent_batches = 0
        self.sent_events = 0
        self._drop_lock = threading.Lock()
        self._start_lock = threading.Lock()
        self._stopping = threading.Event()
        self._reset()
        atexit.register(self._atexit)
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=self.config.max_queue)
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()

    # -- called from user threads: never blocks, never raises --------------------------

    def submit(self, event: Event) -> None:
        self._ensure_thread()
        try:
            self._queue.put_nowait(event)
        except queue.Full:
            self.drop("queue_full")

    def drop(self, reason: str, n: int = 1) -> None:
        with self._drop_lock:
            self.dropped[reason] += n

    def flush(self, timeout: float | None = None) -> bool:
        """Send everything queued so far; True when it was delivered (or refused) in time."""
        if self._thread is None or not self._thread.is_alive():
            return self._queue.empty()
        marker = _Flush()
        try:
            self._queue.put(marker, timeout=timeout)
        except queue.Full:
            return False
        return marker.done.wait(timeout)

    def shutdown(self, timeout: float | None = None) -> None:
        timeout = self.config.exit_timeout_s if timeout is None else timeout
        thread = self._thread
        if thread is None or not thread.is_alive() or os.getpid() != self._pid:
            return
        self.flush(timeout)
        self._stopping.set()
        with contextlib.suppress(queue.Full):
            self._queue.put_nowait(_STOP)
        thread.join(timeout=max(0.1, timeout))

    def _atexit(self) -> None:
        try:
            self.shutdown()
        except Exception:  # never let our exit path break the interpreter's
            log.debug("vigil: error while flushing at exit", exc_info=True)

    def _ensure_thread(self) -> None:
        if self._thread is not None and self._pid == os.getpid():
            return
        with self._start_lock:
            if os.getpid() != self._pid:
                self._reset()
            if self._thread is None and not self._stopping.is_set():
                self._thread = threading.Thread(
                    target=self._run, name="vigil-collector", daemon=True
                )
                self._thread.start()

    # -- the worker thread ---------------------------------------------------------------

    def _run(self) -> None:
        backoff = Backoff()
        next_beat = time.monotonic()
        pending: list[Event] = []
        deadline: float | None = None
        flushes: list[_Flush] = []
        stop = False
        while not stop:
            now = time.monotonic()
            if now >= next_beat:
                beat = self._safe_tick()
                next_beat = now + self.config.heartbeat_s
                if beat:
                    pending.extend(beat)
                    deadline = now  # heartbeats go out at once
            wait_until = next_beat if deadline is None else min(next_beat, deadline)
            try:
                item = self._queue.get(timeout=max(0.0, wait_until - time.monotonic()))
            except queue.Empty:
                item = None
            if item is _STOP:
                stop = True
            elif isinstance(item, _Flush):
                flushes.append(item)
            elif item is not None:
                pending.append(item)
                if deadline is None:
                    deadline = time.monotonic() + self.config.flush_s
            due = deadline is not None and time.monotonic() >= deadline
            if pending and (due or flushes or stop or len(pending) >= self.config.max_batch):
                while pending:
                    chunk, pending = (
                        pending[: self.config.max_batch],
                        pending[self.config.max_batch :],
                    )
                    if not self._deliver(chunk, backoff):
                        break  # stopping while the backend is down: give up
                deadline = None
            if flushes and not pending:
                for marker in flushes:
                    marker.done.set()
                flushes = []
            if not pending:
                deadline = None  # nothing to send: sleep until the next beat or event

    def _safe_tick(self) -> list[Event]:
        try:
            return self._tick()
        except Exception:
            log.debug("vigil: heartbeat failed", exc_info=True)
            return []

    def _deliver(self, events: list[Event], backoff: Backoff) -> bool:
        """Send one batch until it is delivered or refused; False if we gave up."""
        batch = self._envelope(events)
        while True:
            outcome = self.transport.send(batch)
            if outcome.delivered:
                backoff.reset()
                self.sent_batches += 1
                self.sent_events += len(events)
                self._dispatch(outcome)
                return True
            if outcome.retry_after is None:
                log.warning("vigil: batch of %d events dropped (%s)", len(events), outcome.reason)
                self.drop("rejected", len(events))
                return True
            delay = backoff.next_delay() if outcome.retry_after < 0 else outcome.retry_after
            if backoff.failures in (1, 5) or backoff.failures % 50 == 0:
                log.info("vigil: backend not taking data (%s); retrying", outcome.reason)
            if self._stopping.wait(delay):
                self.drop("shutdown", len(events))
                return False
            self._compact(batch)

    def _compact(self, batch: dict[str, Any]) -> None:
        """While retrying, keep only the newest heartbeat of the batch."""
        events = batch["events"]
        beats = [e for e in events if e.get("type") == "heartbeat"]
        if len(beats) > 1:
            newest = beats[-1]
            batch["events"] = [e for e in events if e.get("type") != "heartbeat" or e is newest]

    def _envelope(self, events: list[Event]) -> dict[str, Any]:
        c = self.config
        return {
            "batch_id": str(uuid.uuid4()),
            "job": c.job,
            "kind": c.kind,
            "rank": c.rank,
            "world_size": c.world_size,
            "host": c.host,
            "attempt": c.attempt,
            "events": events,
        }

    def _dispatch(self, outcome: Outcome) -> None:
        if outcome.actions:
            try:
                self._on_actions(outcome.actions)
            except Exception:
                log.warning("vigil: could not dispatch actions", exc_info=True)
