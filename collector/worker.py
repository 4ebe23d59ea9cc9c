"""The background worker: a bounded hand-off queue drained by one daemon thread.

The training thread only ever calls ``submit`` (``put_nowait``; when the hand-off queue is
full the event is dropped and counted as ``queue_full``). The worker thread moves events at
once into its outbox (``collector.outbox``: bounded, the *oldest* telemetry goes first when
it is full), adds a heartbeat every ``heartbeat_s`` (sent from a second thread,
``collector.pulse``, while it waits for a slow answer to telemetry), and ships
(``collector.shipper``): batches by size or time, retried with the same ``batch_id`` so the
server stores a retried batch once, ``Retry-After`` honoured, heartbeats apart from
telemetry, a batch the server will not take set aside, actions from replies handed to a
callback.

It survives ``fork``: a child process gets a fresh queue and outbox and starts its own
thread on first use. At interpreter exit it flushes for at most ``exit_timeout_s``.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from collector.config import Config
from collector.shipper import Shipper
from collector.transport import HttpTransport

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
        self._drop_lock = threading.Lock()
        self._start_lock = threading.Lock()
        self._stopping = threading.Event()
        self._reset()
        atexit.register(self._atexit)
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        c = self.config
        self._pid = os.getpid()
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=c.max_queue)
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        # The worker thread's state (a forked child starts over: the parent ships its own).
        self._ship = Shipper(
            c, self.transport, drop=self.drop, on_actions=self._on_actions, tick=self._safe_tick
        )
        self._flushes: list[tuple[_Flush, int]] = []

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

    def drops(self) -> dict[str, int]:
        """Events dropped by reason, plus ``batches_set_aside``: what heartbeats report."""
        with self._drop_lock:
            out = dict(self.dropped)
        set_aside = self._ship.outbox.set_aside_batches
        if set_aside:
            out["batches_set_aside"] = set_aside
        return out

    def stats(self) -> dict[str, Any]:
        with self._drop_lock:
            dropped = dict(self.dropped)
        ship = self._ship
        return {
            "sent_batches": ship.sent_batches + ship.beats_aside,
            "sent_events": ship.sent_events,
            "dropped": dropped,
            "set_aside_batches": ship.outbox.set_aside_batches,
            "last_error": ship.outbox.last_error,
            "buffered": ship.outbox.held + self._queue.qsize(),
        }

    def flush(self, timeout: float | None = None) -> bool:
        """Send everything queued so far; True when it was delivered (or set aside) in time."""
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
        deadline = time.monotonic() + timeout  # one budget for the flush and the stop
        self.flush(timeout)
        self._stopping.set()
        with contextlib.suppress(queue.Full):
            self._queue.put_nowait(_STOP)
        thread.join(timeout=max(0.1, deadline - time.monotonic()))

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
        ship = self._ship
        stop = False
        while not stop:
            try:
                stop = self._take(ship.wait_s(bool(self._flushes)))
                if stop:
                    break
                if ship.claim_beat(time.monotonic()):
                    for beat in self._safe_tick():
                        ship.hold_beat(beat)
                ship.send(bool(self._flushes))
                self._settle()
            except Exception:  # a bug here must not end shipping for the process
                log.warning("vigil: collector worker error", exc_info=True)
                time.sleep(0.1)
        ship.pulse.stop()
        left = ship.outbox.clear()
        if left:
            self.drop("shutdown", left)

    def _take(self, timeout: float) -> bool:
        """Move what the user threads handed over into the outbox; True on stop."""
        try:
            item = self._queue.get(timeout=timeout)
        except queue.Empty:
            return self._stopping.is_set()
        ship = self._ship
        left = self.config.max_queue  # then trim, and come back for the rest
        while True:
            if item is _STOP:
                return True
            if isinstance(item, _Flush):
                self._flushes.append((item, ship.outbox.taken))
            elif item.get("type") == "heartbeat":
                ship.hold_beat(item)  # the clean-exit one, from ``Client.shutdown``
            else:
                ship.add(item)
            left -= 1
            if not left:
                break
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
        ship.outbox.trim()
        return self._stopping.is_set()

    def _settle(self) -> None:
        if not self._flushes:
            return
        ship, waiting = self._ship, []
        for marker, mark in self._flushes:
            if ship.beat is None and ship.outbox.settled(mark):
                marker.done.set()
            else:
                waiting.append((marker, mark))
        self._flushes = waiting

    def _safe_tick(self) -> list[Event]:
        try:
            return self._tick()
        except Exception:
            log.debug("vigil: heartbeat failed", exc_info=True)
            return []
