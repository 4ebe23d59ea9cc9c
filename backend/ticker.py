"""Embedded mode's stand-in for Celery beat and workers: two daemon threads in the server.

- ``vigil-ticker`` runs detection for the jobs ingest marked in the
  :class:`~backend.detection.schedule.EmbeddedScheduler`, at most every
  ``VIGIL_DETECT_INTERVAL_S`` (debounce: a burst of batches costs one run), the hang and
  crash sweep every ``VIGIL_SWEEP_INTERVAL_S``, and the other periodic tasks on the
  schedule beat would use (:func:`backend.celery_app.beat_schedule`).
- ``vigil-notify`` sends webhook deliveries: woken right after an incident changes and
  every second for retries, so a slow receiver never holds up detection.

Both call the same task functions a Celery worker runs (eagerly, in this process).
Errors are logged, never raised.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable

from backend.celery_app import Runtime, beat_schedule
from backend.detection.schedule import EmbeddedScheduler

log = logging.getLogger(__name__)


class Ticker:
    def __init__(self, rt: Runtime, scheduler: EmbeddedScheduler) -> None:
        self.rt = rt
        self.scheduler = scheduler
        self.interval_s = rt.settings.detect_interval_s
        self._stop = threading.Event()
        self._wake_sender = threading.Event()
        self._threads: list[threading.Thread] = []
        self.last_tick = 0.0  # time.monotonic() of the tick loop's last pass
        rt.wake_sender = self._wake_sender.set

    def start(self) -> None:
        if self._threads:
            return
        for name, target in (("vigil-ticker", self._tick_loop), ("vigil-notify", self._send_loop)):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self, timeout: float = 5) -> None:
        self._stop.set()
        self._wake_sender.set()
        for thread in self._threads:
            thread.join(timeout)

    def alive(self) -> bool:
        """Both threads run, and the tick loop passed recently (a detection run that takes
        minutes, or a thread that died, makes the server not ready: ``/readyz``)."""
        if not self._threads or not all(t.is_alive() for t in self._threads):
            return False
        return time.monotonic() - self.last_tick < max(30.0, 10 * self.interval_s)

    def run_detection(self) -> None:
        """Detect for every job marked since the last call (the debounced batch)."""
        from backend.detection.tasks import run_detection

        for job_id in self.scheduler.drain():
            _guarded(
                f"detection for job {job_id}", functools.partial(run_detection, self.rt, job_id)
            )

    def _tick_loop(self) -> None:
        from backend.actions.tasks import expire_actions
        from backend.alerts.tasks import remind_open_incidents
        from backend.detection.tasks import run_sweep
        from backend.jobs.tasks import retention
        from backend.telemetry.retention import raw_retention

        periodic: dict[str, Callable[[], object]] = {
            "vigil.sweep": lambda: run_sweep(self.rt),
            "vigil.expire_actions": expire_actions,
            "vigil.remind_open_incidents": remind_open_incidents,
            "vigil.retention": retention,
            "vigil.raw_retention": raw_retention,
        }
        every = {
            name: float(entry["schedule"])
            for name, entry in beat_schedule(self.rt.settings).items()
            if name in periodic
        }
        due = {name: time.monotonic() for name in periodic}
        due["vigil.retention"] += 60  # not in the first minute of a fresh start
        due["vigil.raw_retention"] += 60
        self.last_tick = time.monotonic()
        while not self._stop.wait(self.interval_s):
            self.last_tick = time.monotonic()
            self.run_detection()
            for name, work in periodic.items():
                if time.monotonic() >= due[name]:
                    due[name] = time.monotonic() + every[name]
                    _guarded(name, work)

    def _send_loop(self) -> None:
        from backend.alerts.sender import send_due

        while not self._stop.is_set():
            self._wake_sender.wait(1.0)
            self._wake_sender.clear()
            if self._stop.is_set():
                return
            _guarded(
                "webhook delivery",
                lambda: send_due(self.rt.factory, settings=self.rt.settings),
            )


def _guarded(what: str, work: Callable[[], object]) -> None:
    try:
        work()
    except Exception:
        log.exception("%s failed", what)
