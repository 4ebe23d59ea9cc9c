"""New data arrived → detection is scheduled: the one place that decides how, in both modes.

Ingest calls ``scheduler.mark(job_id)`` after it stored a batch with events; what happens
next depends on the mode (``make_scheduler`` picks):

- **embedded** (:class:`EmbeddedScheduler`): the job joins a set of dirty jobs; the
  in-process ticker (``backend.ticker``) drains it every ``VIGIL_DETECT_INTERVAL_S`` and
  runs detection for each (a burst of batches costs one run);
- **distributed** (:class:`CeleryScheduler`): the job joins the ``vigil:detect:pending``
  sorted set (scored by when its oldest unserved request came) and, unless
  ``vigil:detect:queued:<job>`` is set (NX, a short TTL: two intervals), the
  ``vigil.detect_job`` task is queued ``VIGIL_DETECT_INTERVAL_S`` later. The task clears
  the queued key first, so data that arrives while it runs schedules the next run, and
  takes the job off the pending set only when the run succeeded and no request came
  meanwhile (:func:`begin` / :func:`served`). Each task carries a ticket (a per-job
  count of tasks sent); one that starts after a run that began once it was sent has
  nothing left to do and returns at once (:func:`redundant`; a run that began and then
  failed leaves its job pending, which beat re-queues). Without that, runs slower
  than the debounce (a 512-rank job on PostgreSQL takes seconds) piled up in the queue,
  one more every two intervals, and the periodic sweeps expired behind them. A task lost
  with its worker (SIGKILL, OOM) leaves the job pending: beat re-queues every job pending
  for longer than two intervals (:func:`requeue_overdue`), so detection resumes
  within two intervals of a worker being back, with or without new data. The age of the
  oldest pending request is the detection lag (``/readyz``, ``/metrics``). Redis trouble
  is logged (once a minute), never raised: the batch is stored, and the next batch
  schedules the run.

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
        self._dirty: dict[int, float] = {}  # job -> when it was first marked
        self._lock = threading.Lock()

    def mark(self, job_id: int) -> None:
        with self._lock:
            self._dirty.setdefault(job_id, time.time())

    def drain(self) -> list[int]:
        """The jobs marked since the last call, in id order; the set starts afresh."""
        with self._lock:
            dirty, self._dirty = self._dirty, {}
        return sorted(dirty)

    def lag(self, now: float | None = None) -> tuple[float, int]:
        """(age of the oldest mark not drained yet, jobs marked)."""
        now = time.time() if now is None else now
        with self._lock:
            oldest = min(self._dirty.values(), default=now)
            return max(0.0, now - oldest), len(self._dirty)


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


PENDING = f"{KEY_PREFIX}detect:pending"  # job -> when its oldest unserved request came
REQUESTS = f"{KEY_PREFIX}detect:requests"  # job -> requests so far (tells a run what it saw)
SENT = f"{KEY_PREFIX}detect:sent"  # job -> tickets handed out (tasks sent)
STARTED = f"{KEY_PREFIX}detect:started"  # job -> the newest ticket sent when a run began


def queued_key(job_id: int) -> str:
    return f"{KEY_PREFIX}detect:queued:{job_id}"


def requeued_key(job_id: int) -> str:
    return f"{KEY_PREFIX}detect:requeued:{job_id}"


# Record the request; say whether a run must be queued (no run queued in the interval).
_MARK = """
redis.call('zadd', KEYS[1], 'NX', ARGV[2], ARGV[1])
redis.call('hincrby', KEYS[2], ARGV[1], 1)
if redis.call('set', KEYS[3], 1, 'NX', 'PX', ARGV[3]) then return 1 end
return 0
"""
# A run begins: new data now queues the next run; tasks sent so far are covered by this
# one; the requests it answers.
_BEGIN = """
redis.call('del', KEYS[1])
local sent = redis.call('hget', KEYS[2], ARGV[1])
if sent then redis.call('hset', KEYS[3], ARGV[1], sent) end
return redis.call('hget', KEYS[4], ARGV[1])
"""
# A run that saw ``ARGV[2]`` requests succeeded: the job is served unless more came since,
# in which case it stays pending, as of when that run started (``ARGV[3]``).
_SERVED = """
local seen = redis.call('hget', KEYS[2], ARGV[1])
if seen == false or seen == ARGV[2] then
  redis.call('zrem', KEYS[1], ARGV[1])
  redis.call('hdel', KEYS[2], ARGV[1])
  return 1
end
redis.call('zadd', KEYS[1], 'XX', ARGV[3], ARGV[1])
return 0
"""


def debounce_ms(interval_s: float) -> int:
    """How long one queued run stands for every request: two intervals, at least a second.
    Short on purpose: a run lost with its worker must not block the next one for long."""
    return max(1000, int(2000 * interval_s))


def queue_detection(job_id: int) -> None:
    """Distributed: record a detection request; queue a run unless one is queued already."""
    rt = runtime()
    if rt.redis is None:
        raise RuntimeError("queue_detection is for distributed mode; embedded uses the ticker")
    delay = rt.settings.detect_interval_s
    keys = (PENDING, REQUESTS, queued_key(job_id))
    if rt.redis.eval(_MARK, 3, *keys, job_id, time.time(), debounce_ms(delay)):
        _send(job_id, countdown=delay)


def queue_run(job_id: int) -> None:
    """Queue a run for the job after an interval, for a task that found another run on
    the job: it was sent after that run began, so its data may be newer than that run's
    reads. Not debounced: the queued key may still be the one its own request set."""
    rt = runtime()
    assert rt.redis is not None
    delay = rt.settings.detect_interval_s
    rt.redis.set(queued_key(job_id), 1, px=debounce_ms(delay))
    _send(job_id, countdown=delay)


def _send(job_id: int, *, countdown: float) -> None:
    from backend.detection.tasks import detect_job  # the task module imports this one

    redis = runtime().redis
    assert redis is not None
    ticket = int(redis.hincrby(SENT, str(job_id), 1))
    detect_job.apply_async((job_id, ticket), countdown=countdown)


def redundant(job_id: int, ticket: int | None) -> bool:
    """Whether a run of the job began after task ``ticket`` was sent: that run read every
    batch this task was queued for, and later batches queued their own task."""
    if ticket is None:  # a task sent before tickets existed
        return False
    redis = runtime().redis
    assert redis is not None
    started = redis.hget(STARTED, str(job_id))
    return started is not None and int(started) >= ticket


def begin(job_id: int) -> str | None:
    """A run starts (holding the job's lock): data from now on queues the next run, the
    tasks sent so far are covered (:func:`redundant`), and the result is how many
    requests it answers (for :func:`served`). One script, so no request falls between."""
    redis = runtime().redis
    assert redis is not None
    seen = redis.eval(_BEGIN, 4, queued_key(job_id), SENT, STARTED, REQUESTS, job_id)
    return seen.decode() if isinstance(seen, bytes) else seen


def served(job_id: int, seen: str | None, started: float) -> None:
    """A run that started at ``started`` and answered ``seen`` requests succeeded."""
    redis = runtime().redis
    assert redis is not None
    redis.eval(_SERVED, 2, PENDING, REQUESTS, job_id, seen or "", started)


def requeue_overdue(now: float | None = None) -> list[int]:
    """Queue a run now for every job pending longer than two intervals (its run was lost:
    a killed worker, a Redis restart) — once per two intervals per job, so a dead worker
    does not pile up runs. Returns the jobs re-queued."""
    rt = runtime()
    assert rt.redis is not None
    now = time.time() if now is None else now
    interval = rt.settings.detect_interval_s
    overdue = rt.redis.zrangebyscore(PENDING, "-inf", now - 2 * interval)
    requeued = []
    for raw in overdue:
        job_id = int(raw)  # type: ignore[arg-type]
        if rt.redis.set(requeued_key(job_id), 1, nx=True, px=debounce_ms(interval)):
            _send(job_id, countdown=0)
            requeued.append(job_id)
    if requeued:
        log.warning("detection overdue for jobs %s: re-queued", requeued)
    return requeued


def pending_lag(now: float | None = None) -> tuple[float, int]:
    """Distributed: (age of the oldest pending detection request, jobs pending)."""
    redis = runtime().redis
    assert redis is not None
    now = time.time() if now is None else now
    with redis.pipeline(transaction=False) as pipe:
        pipe.zrange(PENDING, 0, 0, withscores=True)
        pipe.zcard(PENDING)
        oldest, count = pipe.execute()
    lag = max(0.0, now - float(oldest[0][1])) if oldest else 0.0
    return lag, int(count)
