"""New data arrived → detection is scheduled: the one place that decides how, in both modes.

Ingest calls ``scheduler.mark(job_id)`` after it stored a batch with events; what happens
next depends on the mode (``make_scheduler`` picks):

- **embedded** (:class:`EmbeddedScheduler`): the job joins a set of dirty jobs; the
  in-process ticker (``backend.ticker``) drains it every ``VIGIL_DETECT_INTERVAL_S`` and
  runs detection for each (a burst of batches costs one run);
- **distributed** (:class:`CeleryScheduler`): the first batch in an interval sets
  ``vigil:detect:queued:<job>`` in Redis (NX) and queues the ``vigil.detect_job`` task
  ``VIGIL_DETECT_INTERVAL_S`` later; the task clears the key first, so data that arrives
  while it runs schedules the next run. Redis trouble is logged (once a minute), never
  raised: the batch is stored, and the next batch schedules the run.

``VIGIL_DETECT_INTERVAL_S=0`` switches detection off (no scheduler).

    scheduler = make_scheduler(settings)
    scheduler.mark(7)                     # from the ingest view, after the commit
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Protocol

from backend.celery_app import KEY_PREFIX, runtime
from backend.settings import Settings

log = logging.getLogger(__name__)


class DetectionScheduler(Protocol):
    def mark(self, job_id: int) -> None:
        """Job ``job_id`` has new data: make sure a detection run for it follows."""


class EmbeddedScheduler:
    """The dirty-job set the embedded ticker drains."""

    def __init__(self) -> None:
        self._dirty: set[int] = set()
        self._lock = threading.Lock()

    def mark(self, job_id: int) -> None:
        with self._lock:
            self._dirty.add(job_id)

    def drain(self) -> list[int]:
        """The jobs marked since the last call, in id order; the set starts afresh."""
        with self._lock:
            dirty, self._dirty = self._dirty, set()
        return sorted(dirty)


class CeleryScheduler:
    """Distributed mode: one ``vigil.detect_job`` task per job and interval."""

    def __init__(self) -> None:
        self._warned = 0.0

    def mark(self, job_id: int) -> None:
        try:
            queue_detection(job_id)
        except Exception:
            now = time.monotonic()
            if now - self._warned > 60:  # once a minute, not once a batch
                self._warned = now
                log.exception("could not schedule detection for job %s", job_id)


def make_scheduler(settings: Settings) -> EmbeddedScheduler | CeleryScheduler | None:
    if settings.detect_interval_s <= 0:
        return None
    return EmbeddedScheduler() if settings.embedded else CeleryScheduler()


def queued_key(job_id: int) -> str:
    return f"{KEY_PREFIX}detect:queued:{job_id}"


def queue_detection(job_id: int) -> None:
    """Distributed: queue one detection run for the job unless one is queued already."""
    from backend.detection.tasks import detect_job  # the task module imports this one

    rt = runtime()
    if rt.redis is None:
        raise RuntimeError("queue_detection is for distributed mode; embedded uses the ticker")
    delay = rt.settings.detect_interval_s
    if rt.redis.set(queued_key(job_id), 1, nx=True, ex=int(delay) + 120):
        detect_job.apply_async((job_id,), countdown=delay)
