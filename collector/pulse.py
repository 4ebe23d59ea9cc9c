"""Heartbeats that do not wait behind telemetry: a second daemon thread for the time the
worker is blocked in a telemetry request.

The worker thread (``collector.worker``) makes one request at a time, and sends the
heartbeat alone whenever telemetry waits (``collector.shipper``). But while it waits for the
answer to a telemetry batch — an overloaded server answers late, up to the collector's
``timeout_s``, often with a 429 at the end — a heartbeat that falls due waits with it, and
the rank looks silent for as long: at a few seconds, long enough to be called crashed. The
pulse covers that time. While the worker is inside a telemetry request (``cover``), the
pulse takes each heartbeat tick that falls due and sends that heartbeat on its own, in a
heartbeat-only batch with its own batch id: the kind of batch the server still takes when
it refuses telemetry (``backend.ingest.admission``).

It holds no telemetry (the worker alone sends and retries that, so each batch is still
stored once) and at most the one heartbeat it is sending. It sleeps while the worker is not
in a request, and never raises: a heartbeat it could not deliver is logged at debug level,
and the next tick sends a fresh one.

    pulse = Pulse(due_in=lambda: beat_at - time.monotonic(), beat=send_one_heartbeat)
    with pulse.cover():              # on the worker thread, around a telemetry request
        outcome = transport.send(batch)
    pulse.stop()                     # when the worker ends
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator

log = logging.getLogger("vigil.collector")

ERROR_PAUSE_S = 0.1  # after an unexpected error, so a bug cannot make the thread spin


class Pulse:
    """``due_in()``: seconds until the next heartbeat tick (≤ 0: due); ``beat()``: claim
    that tick and send its heartbeat alone (it does nothing when the worker took the tick
    first). Both are called on the pulse's thread."""

    def __init__(self, *, due_in: Callable[[], float], beat: Callable[[], None]) -> None:
        self._due_in = due_in
        self._beat = beat
        self._cond = threading.Condition()
        self._covering = False
        self._stopped = False
        self._thread: threading.Thread | None = None

    @contextlib.contextmanager
    def cover(self) -> Iterator[None]:
        """The worker is inside a request: heartbeats falling due meanwhile go without it."""
        with self._cond:
            self._start_locked()
            self._covering = True
            self._cond.notify_all()
        try:
            yield
        finally:
            with self._cond:
                self._covering = False

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()

    def _start_locked(self) -> None:
        # Started on first use: by the worker thread of this process (after a fork the
        # child has a new worker, with a new pulse).
        if self._thread is not None or self._stopped:
            return
        self._thread = threading.Thread(target=self._run, name="vigil-pulse", daemon=True)
        try:
            self._thread.start()
        except RuntimeError:  # at interpreter exit (3.12+): the worker goes on without it
            log.debug("vigil: no heartbeat pulse thread", exc_info=True)
            self._stopped = True

    def _run(self) -> None:
        while self._wait_for_tick():
            try:
                self._beat()
            except Exception:  # a bug here must not end liveness for the process
                log.debug("vigil: heartbeat pulse error", exc_info=True)
                time.sleep(ERROR_PAUSE_S)

    def _wait_for_tick(self) -> bool:
        """Until a heartbeat is due while the worker is in a request; False once stopped."""
        with self._cond:
            while not self._stopped:
                if not self._covering:
                    self._cond.wait()
                    continue
                wait = self._due_in()
                if wait <= 0:
                    return True
                self._cond.wait(wait)
            return False
