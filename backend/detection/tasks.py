"""Detection as tasks: a debounced run per job after ingest, and the periodic sweep.

Debounce (distributed): ingest sets ``vigil:detect:queued:<job>`` with NX; only the batch
that set it enqueues a run, ``VIGIL_DETECT_INTERVAL_S`` later. The run clears the key
first, so data that arrives while it runs schedules the next one. A per-job lock keeps two
workers from running the same job at once. Embedded mode: the ticker keeps the dirty set.
"""

from __future__ import annotations

import logging
import time

from backend.celery_app import KEY_PREFIX, Runtime, redis_lock, runtime, vigil_task
from backend.db import session_scope
from backend.detection import runner
from backend.pipeline import after_commit, react

log = logging.getLogger(__name__)


def _queued_key(job_id: int) -> str:
    return f"{KEY_PREFIX}detect:queued:{job_id}"


def schedule_detection(job_id: int) -> None:
    """After ingest (distributed): make sure one detection run for the job is queued."""
    rt = runtime()
    if rt.redis is None:
        raise RuntimeError("schedule_detection is for distributed mode; embedded uses the ticker")
    delay = rt.settings.detect_interval_s
    if rt.redis.set(_queued_key(job_id), 1, nx=True, ex=int(delay) + 120):
        detect_job.apply_async((job_id,), countdown=delay)


@vigil_task("detect_job")
def detect_job(job_id: int) -> None:
    """Run the window detectors for one job and act on what changed."""
    rt = runtime()
    if rt.redis is not None:
        rt.redis.delete(_queued_key(job_id))
    with redis_lock(f"detect:{job_id}", ttl_s=120) as got:
        if not got:  # another worker is on this job: come back after it
            schedule_detection(job_id)
            return
        run_detection(rt, job_id)


def run_detection(rt: Runtime, job_id: int) -> None:
    with session_scope(rt.factory, write=True) as session:
        changes = runner.detect_job(
            session=session, job_id=job_id, width=rt.settings.detect_window_steps
        )
        deliveries = react(session=session, changes=changes, settings=rt.settings)
    after_commit(deliveries)


@vigil_task("sweep")
def sweep() -> None:
    """Hangs and crashes: jobs whose steps or heartbeats stopped. One beat at a time."""
    rt = runtime()
    with redis_lock("sweep", ttl_s=max(5.0, rt.settings.sweep_interval_s * 5)) as got:
        if got:
            run_sweep(rt)


def run_sweep(rt: Runtime) -> None:
    now = time.time()
    with session_scope(rt.factory) as session:
        jobs = runner.active_jobs(session=session)
    for job_id in jobs:
        try:
            with session_scope(rt.factory, write=True) as session:
                changes = runner.sweep_job(session=session, job_id=job_id, now=now)
                deliveries = react(session=session, changes=changes, settings=rt.settings)
            after_commit(deliveries)
        except Exception:  # one bad job must not stop the sweep of the others
            log.exception("sweep of job %s failed", job_id)
