"""Is this Vigil able to do its job? ``GET /readyz``, and the pipeline gauges in ``/metrics``.

``/healthz`` is *liveness*: this process answers and reaches its database (restart it if
not). ``/readyz`` is *readiness* of the whole pipeline, 200 or 503 with the reasons:

- **distributed**: Redis answers, at least one worker and a beat said they were alive in
  the last ``STALE_S`` seconds, and the detection lag (age of the oldest detection request
  not served yet, ``backend.detection.schedule``) is at most ``VIGIL_READY_MAX_LAG_S``;
- **embedded**: the in-process ticker (beat and worker in one) runs, and the same lag
  bound holds for the jobs it has yet to look at.

Workers and beat publish their heartbeats here: the worker's main process every
``HEARTBEAT_S`` from a thread started when it is ready (``backend.celery_app``), beat on
each tick of its scheduler. Each is a member ``host:pid`` of a Redis sorted set scored by
time, so reading them is two ``ZCOUNT`` s, cheap enough for every probe and scrape.

    curl -s localhost:8000/readyz
    {"status": "not ready", "reasons": ["no worker alive (none in the last 10 s)"], ...}
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import socket
import threading
import time
from typing import Any

from fastapi import APIRouter, FastAPI, Request, Response
from redis.exceptions import RedisError
from sqlalchemy import text

from backend.celery_app import KEY_PREFIX, runtime
from backend.detection.schedule import PENDING, EmbeddedScheduler
from backend.metrics import DETECTOR_RUNS, PIPELINE

log = logging.getLogger(__name__)

HEARTBEAT_S = 2.0  # how often workers and beat say they are alive
STALE_S = 10.0  # silent this long: not alive (a SIGKILLed worker drops out after this)

router = APIRouter(tags=["ops"])


def alive_key(role: str) -> str:
    return f"{KEY_PREFIX}alive:{role}"


def _member() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


_last_beat: dict[str, float] = {}
_warned = 0.0


def heartbeat(role: str, now: float | None = None) -> None:
    """Say this process (a ``worker`` or ``beat``) is alive; at most once a second.
    Redis trouble is logged once a minute, never raised."""
    global _warned
    now = time.time() if now is None else now
    if now - _last_beat.get(role, 0.0) < 1.0:
        return
    redis = runtime().redis
    if redis is None:
        return
    key = alive_key(role)
    try:
        with redis.pipeline(transaction=False) as pipe:
            pipe.zadd(key, {_member(): now})
            pipe.zremrangebyscore(key, "-inf", now - 30 * STALE_S)  # long-gone processes
            pipe.expire(key, int(30 * STALE_S))
            pipe.execute()
        _last_beat[role] = now
    except RedisError as exc:
        if time.monotonic() - _warned > 60:
            _warned = time.monotonic()
            log.warning("could not publish the %s heartbeat: %s", role, exc)


_threads: dict[str, threading.Event] = {}


def start_heartbeat(role: str) -> None:
    """Publish ``role``'s heartbeat every ``HEARTBEAT_S`` from a daemon thread."""
    if role in _threads:
        return
    stop = _threads[role] = threading.Event()

    def loop() -> None:
        while True:
            heartbeat(role)
            if stop.wait(HEARTBEAT_S):
                return

    threading.Thread(target=loop, name=f"vigil-{role}-heartbeat", daemon=True).start()


def stop_heartbeat(role: str) -> None:
    """Stop publishing and take this process out at once (a clean shutdown)."""
    stop = _threads.pop(role, None)
    if stop is not None:
        stop.set()
    redis = runtime().redis
    if redis is not None:
        with contextlib.suppress(RedisError):
            redis.zrem(alive_key(role), _member())


def pipeline_status(app: FastAPI, now: float | None = None) -> dict[str, Any]:
    """Workers and beat alive, detection lag and pending jobs, and what is wrong."""
    now = time.time() if now is None else now
    settings = app.state.settings
    scheduler = app.state.detection_scheduler
    status: dict[str, Any] = {"workers": 0, "beat": 0, "detection_lag_s": 0.0, "pending_jobs": 0}
    reasons: list[str] = []
    if settings.embedded:
        ticker = app.state.ticker
        running = int(ticker is not None and ticker.alive())
        status.update(workers=running, beat=running)
        if isinstance(scheduler, EmbeddedScheduler):
            status["detection_lag_s"], status["pending_jobs"] = scheduler.lag(now)
            if not running:
                reasons.append("the in-process ticker is not running")
    else:
        redis = runtime().redis
        assert redis is not None
        try:
            with redis.pipeline(transaction=False) as pipe:
                pipe.zcount(alive_key("worker"), now - STALE_S, "+inf")
                pipe.zcount(alive_key("beat"), now - STALE_S, "+inf")
                pipe.zrange(PENDING, 0, 0, withscores=True)
                pipe.zcard(PENDING)
                workers, beat, oldest, pending = pipe.execute()
        except RedisError as exc:
            status["detection_lag_s"] = math.nan
            reasons.append(f"redis: {type(exc).__name__}")
        else:
            lag = max(0.0, now - float(oldest[0][1])) if oldest else 0.0
            status.update(
                workers=int(workers), beat=int(beat), detection_lag_s=lag, pending_jobs=pending
            )
            if not workers:
                reasons.append(f"no worker alive (none in the last {STALE_S:.0f} s)")
            if not beat:
                reasons.append(f"beat not alive (not in the last {STALE_S:.0f} s)")
    lag = status["detection_lag_s"]
    if lag > settings.ready_max_lag_s:
        reasons.append(
            f"detection lag {lag:.0f} s > {settings.ready_max_lag_s:g} s "
            f"({status['pending_jobs']} jobs waiting)"
        )
    status["reasons"] = reasons
    return status


@router.get(
    "/readyz",
    responses={503: {"description": "Not ready: the same body, `reasons` says why."}},
)
def readyz(request: Request, response: Response) -> dict[str, Any]:
    """Readiness: 200 when the pipeline (database, Redis, workers, beat, detection lag)
    works, 503 with ``reasons`` otherwise. ``/healthz`` is the liveness check."""
    app = request.app
    status = pipeline_status(app)
    try:
        with app.state.sessionmaker() as session:
            session.execute(text("SELECT 1"))
    except Exception as exc:  # report, don't raise: this is the probe
        status["reasons"].insert(0, f"database: {type(exc).__name__}")
    if math.isnan(status["detection_lag_s"]):
        status["detection_lag_s"] = None
    ready = not status["reasons"]
    if not ready:
        response.status_code = 503
    mode = "embedded" if app.state.settings.embedded else "distributed"
    return {"status": "ready" if ready else "not ready", "mode": mode, **status}


def install(app: FastAPI) -> None:
    """Mount ``/readyz`` and feed the pipeline gauges of ``/metrics`` from this app."""
    app.include_router(router)

    def gauges() -> dict[str, float]:
        status = pipeline_status(app)
        return {
            "vigil_worker_alive": status["workers"],
            "vigil_beat_alive": status["beat"],
            "vigil_detection_lag_seconds": status["detection_lag_s"],
            "vigil_detection_pending_jobs": status["pending_jobs"],
        }

    PIPELINE.source = gauges
    DETECTOR_RUNS.shared = lambda: runtime().redis


def local_alive(role: str, now: float | None = None) -> bool:
    """Whether a ``role`` process on this host sent a heartbeat within ``STALE_S``."""
    redis = runtime().redis
    if redis is None:
        return False
    now = time.time() if now is None else now
    prefix = f"{socket.gethostname()}:"
    members = redis.zrangebyscore(alive_key(role), now - STALE_S, "+inf")
    return any(bytes(m).decode().startswith(prefix) for m in members)  # type: ignore[arg-type]


if __name__ == "__main__":  # a container healthcheck: python -m backend.readiness worker
    import sys

    role = sys.argv[1] if len(sys.argv) > 1 else "worker"
    try:
        sys.exit(0 if local_alive(role) else 1)
    except RedisError as exc:
        print(f"redis: {exc}", file=sys.stderr)
        sys.exit(1)
