"""Celery for Vigil: the app, the one task decorator, each process's runtime, Redis locks.

Distributed mode (``VIGIL_REDIS_URL`` set)::

    vigil worker          # runs tasks from the ``vigil`` queue
    vigil beat            # schedules the periodic sweeps (exactly one per installation)

Embedded mode (no Redis): the app is eager, so ``task.delay(...)`` runs the task in the
calling thread, and the in-process :mod:`backend.ticker` plays beat. The same task
functions run either way.

Tasks take ids, never ORM objects; each opens its own session and commits (services only
flush). Periodic tasks take a Redis lock, so two beats never double-act.

    @vigil_task("sweep")
    def sweep() -> None: ...
"""

from __future__ import annotations

import functools
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from celery import Celery, Task
from celery.beat import PersistentScheduler
from celery.signals import worker_init, worker_process_init, worker_ready, worker_shutdown
from redis import Redis
from redis.exceptions import RedisError
from sqlalchemy.exc import OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.orm import Session, sessionmaker

from backend.db import make_engine, make_sessionmaker
from backend.metrics import TASK_RUNS, TASK_SECONDS
from backend.settings import Settings, get_settings

log = logging.getLogger(__name__)

QUEUE = "vigil"
KEY_PREFIX = "vigil:"

celery = Celery("vigil")
celery.conf.update(
    broker_url="memory://",
    task_always_eager=True,
    task_default_queue=QUEUE,
    task_ignore_result=True,
    imports=("backend.tasks",),
    timezone="UTC",
    enable_utc=True,
)


# Ride out a broker restart instead of exiting: retry connecting for ever (at start too),
# the transport whose close survives a lost Redis (``backend.broker``), dead sockets found
# by keepalive and health checks rather than by a task that hangs. A late-acked task
# running when the broker goes away is cancelled (it could not be acknowledged anyway);
# detection re-queues what a lost task would have done (``backend.detection.schedule``).
BROKER_RESILIENCE: dict[str, Any] = {
    "broker_transport": "backend.broker:Transport",
    "broker_connection_retry": True,
    "broker_connection_retry_on_startup": True,
    "broker_connection_max_retries": None,
    "broker_transport_options": {
        "socket_connect_timeout": 5,
        "socket_keepalive": True,
        "health_check_interval": 10,
        "retry_on_timeout": True,
        # A message a SIGKILLed worker held comes back after this long. Longer than any
        # task may run (time limit + 30 s), so a running task is never handed out twice.
        "visibility_timeout": 600,
    },
    "worker_cancel_long_running_tasks_on_connection_loss": True,
}


@dataclass
class Runtime:
    """What tasks need in this process: settings, a session factory, Redis (distributed)."""

    settings: Settings
    factory: sessionmaker[Session]
    redis: Redis | None = None
    # Embedded mode: nudges the in-process webhook sender (set by the ticker).
    wake_sender: Callable[[], None] = field(default=lambda: None)


_runtime: Runtime | None = None


def configure(settings: Settings, factory: sessionmaker[Session] | None = None) -> Runtime:
    """Set this process's runtime and point Celery at Redis, or make it eager (embedded)."""
    global _runtime
    if factory is None:
        factory = make_sessionmaker(
            make_engine(settings.database_url, pool_size=settings.db_pool_size)
        )
    redis = None
    if settings.embedded:
        celery.conf.update(broker_url="memory://", task_always_eager=True)
    else:
        assert settings.redis_url is not None
        redis = Redis.from_url(settings.redis_url, socket_timeout=5, socket_connect_timeout=5)
        celery.conf.update(
            broker_url=settings.redis_url,
            task_always_eager=False,
            task_acks_late=True,  # tasks are idempotent: a worker lost mid-task is redone
            task_reject_on_worker_lost=True,
            worker_prefetch_multiplier=1,
            **BROKER_RESILIENCE,
            beat_schedule=beat_schedule(settings),
            beat_scheduler="backend.celery_app:BeatScheduler",
        )
    _runtime = Runtime(settings=settings, factory=factory, redis=redis)
    return _runtime


def runtime() -> Runtime:
    """This process's runtime; a worker builds it from the environment on first use."""
    return _runtime if _runtime is not None else configure(get_settings())


@worker_process_init.connect  # type: ignore[untyped-decorator]
def _after_fork(**_: Any) -> None:
    # Database connections and Redis sockets must not cross a fork: start afresh.
    global _runtime
    _runtime = None


EXPIRES_FLOOR_S = 30.0  # a periodic task queued this long still runs (see beat_schedule)


def beat_schedule(settings: Settings) -> dict[str, dict[str, Any]]:
    """The periodic tasks, with the same intervals the embedded ticker uses."""
    every = {
        "vigil.sweep": settings.sweep_interval_s,
        "vigil.send_due_notifications": 5.0,
        "vigil.remind_open_incidents": 60.0,
        "vigil.expire_actions": 15.0,
        "vigil.retention": 3600.0,
        "vigil.raw_retention": 3600.0,
    }
    # A periodic task that waited longer than its period, and than EXPIRES_FLOOR_S (no
    # worker was up), is dropped unrun when a worker gets it: the next one is due anyway,
    # and a backlog of stale sweeps must not stand between a worker that is back and the
    # detection runs. Not sooner: behind detection runs of a few seconds each (a 512-rank
    # job on PostgreSQL, bench/README.md "Through relays"), a 2-s sweep that expired after
    # its period was dropped again and again, and hangs and crashes went unseen.
    return {
        name: {
            "task": name,
            "schedule": seconds,
            "options": {"expires": max(seconds, EXPIRES_FLOOR_S)},
        }
        for name, seconds in every.items()
    }


class BeatScheduler(PersistentScheduler):  # type: ignore[misc]
    """Celery's scheduler, which also says every few seconds that beat is alive
    (``/readyz``) and, every detection interval, re-queues detection runs that were lost
    (``backend.detection.schedule.requeue_overdue``: beat does it itself, so the runs are
    queued before a worker that was down comes back)."""

    _requeued_at = 0.0

    def tick(self, *args: Any, **kwargs: Any) -> float:
        from backend.detection.schedule import requeue_overdue
        from backend.readiness import HEARTBEAT_S, heartbeat

        heartbeat("beat")
        every = runtime().settings.detect_interval_s
        if every > 0 and time.monotonic() - self._requeued_at >= every:
            self._requeued_at = time.monotonic()
            try:
                requeue_overdue()
            except RedisError as exc:  # Redis is away: the next tick tries again
                log.warning("could not re-queue overdue detection: %s", exc)
        wait = min(float(super().tick(*args, **kwargs)), HEARTBEAT_S)
        return min(wait, every) if every > 0 else wait


@worker_init.connect  # type: ignore[untyped-decorator]
def _worker_init(**_: Any) -> None:
    # Import every detector module before the pool forks, not in each child's first run
    # (a second per child on a small box: detection after a worker restart waited for it).
    from detectors import registry

    registry.detectors()


@worker_ready.connect  # type: ignore[untyped-decorator]
def _worker_ready(**_: Any) -> None:
    # The worker's main process says it is alive every few seconds, until it stops.
    from backend.readiness import start_heartbeat

    start_heartbeat("worker")


@worker_shutdown.connect  # type: ignore[untyped-decorator]
def _worker_shutdown(**_: Any) -> None:
    from backend.readiness import stop_heartbeat

    stop_heartbeat("worker")


def vigil_task(
    name: str, *, max_retries: int = 3, time_limit_s: float = 120
) -> Callable[[Callable[..., Any]], Task]:
    """Register a task as ``vigil.<name>`` on the Vigil queue, timed and counted.

    Transient database or Redis errors are retried with exponential backoff (at most
    ``max_retries`` times); anything else is logged by Celery and counted as failed.
    """

    def wrap(fn: Callable[..., Any]) -> Task:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            outcome = "failed"
            try:
                result = fn(*args, **kwargs)
                outcome = "ok"
                return result
            finally:
                TASK_SECONDS.labels(name).observe(time.perf_counter() - started)
                TASK_RUNS.labels(name, outcome).inc()

        task = celery.task(
            name=f"vigil.{name}",
            queue=QUEUE,
            ignore_result=True,
            autoretry_for=(OperationalError, PoolTimeout, RedisError),
            retry_backoff=True,
            retry_backoff_max=60,
            retry_jitter=True,
            max_retries=max_retries,
            soft_time_limit=time_limit_s,
            time_limit=time_limit_s + 30,
        )(timed)
        return task

    return wrap


@contextmanager
def redis_lock(name: str, ttl_s: float, *, renew: bool = False) -> Iterator[bool]:
    """Hold ``vigil:lock:<name>`` for at most ``ttl_s``; yields whether we got it.

    Embedded mode has one process and its ticker runs one thing at a time: always True.
    The lock is released only by its holder (compare-and-delete), so a holder that ran
    past its TTL cannot free someone else's lock. With ``renew`` it is a lease: a thread
    extends it every ``ttl_s / 3`` while the holder runs, so the TTL can be short (a
    holder that is killed frees it within ``ttl_s``) however long the work takes.
    """
    redis = runtime().redis
    if redis is None:
        yield True
        return
    key, token = f"{KEY_PREFIX}lock:{name}", uuid.uuid4().hex
    ttl_ms = max(1, int(ttl_s * 1000))
    got = bool(redis.set(key, token, nx=True, px=ttl_ms))
    stop = threading.Event()
    if got and renew:
        threading.Thread(
            target=_renew, args=(redis, key, token, ttl_ms, stop), name="vigil-lease", daemon=True
        ).start()
    try:
        yield got
    finally:
        stop.set()
        if got:
            try:
                redis.eval(_RELEASE, 1, key, token)
            except RedisError:
                log.warning("could not release lock %s; it expires in %.0f s", key, ttl_s)


def _renew(redis: Redis, key: str, token: str, ttl_ms: int, stop: threading.Event) -> None:
    while not stop.wait(ttl_ms / 3000):
        try:
            if not redis.eval(_EXTEND, 1, key, token, ttl_ms):
                log.warning("lost lock %s while holding it", key)
                return
        except RedisError:
            pass  # Redis is away: the lease runs out, as it should


_RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end
return 0
"""
_EXTEND = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) end
return 0
"""
