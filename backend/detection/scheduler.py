"""Embedded mode's in-process scheduler: detection after ingest, sweeps on a timer.

Ingest marks a job dirty; a daemon thread runs the window detectors for dirty jobs at most
every ``interval_s`` (debounce: a burst of batches costs one run), and sweeps active jobs
for hangs and crashes every ``sweep_s``. Off the request path; errors are logged, never
raised. In distributed mode Celery workers run the same functions.
"""

from __future__ import annotations

import logging
import threading
import time

from sqlalchemy.orm import Session, sessionmaker

from backend.db import session_scope
from backend.detection.runner import active_jobs, detect_job, sweep_job

log = logging.getLogger(__name__)


class DetectionLoop:
    def __init__(
        self,
        factory: sessionmaker[Session],
        *,
        interval_s: float,
        sweep_s: float,
        window_steps: int = 200,
    ) -> None:
        self.factory = factory
        self.interval_s = interval_s
        self.sweep_s = sweep_s
        self.window_steps = window_steps
        self._dirty: set[int] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def mark(self, job_id: int) -> None:
        with self._lock:
            self._dirty.add(job_id)

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="vigil-detect", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 5) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def run_once(self, *, sweep: bool = True) -> None:
        with self._lock:
            dirty, self._dirty = self._dirty, set()
        for job_id in sorted(dirty):
            self._guarded(
                lambda s, j=job_id: detect_job(session=s, job_id=j, width=self.window_steps)
            )
        if sweep:
            now = time.time()
            with session_scope(self.factory) as session:
                jobs = active_jobs(session=session)
            for job_id in jobs:
                self._guarded(lambda s, j=job_id: sweep_job(session=s, job_id=j, now=now))

    def _guarded(self, work) -> None:  # type: ignore[no-untyped-def]
        try:
            with session_scope(self.factory, write=True) as session:
                changes = work(session)
            for row in changes.opened:
                log.warning("incident opened: %s %s (ranks %s)", row.kind, row.summary, row.ranks)
            for row in changes.resolved:
                log.info("incident resolved: %s %s", row.kind, row.summary)
        except Exception:
            log.exception("detection run failed")

    def _run(self) -> None:
        next_sweep = time.monotonic()
        while not self._stop.wait(self.interval_s):
            sweep = time.monotonic() >= next_sweep
            if sweep:
                next_sweep = time.monotonic() + self.sweep_s
            self.run_once(sweep=sweep)
