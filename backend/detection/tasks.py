"""Detection as tasks: a debounced run per job after ingest, and the periodic sweep.

How a run gets scheduled is ``backend.detection.schedule``'s business; this module is what
runs: the detectors (``backend.detection.runner``), then, in the same transaction, alerts
and recovery for what changed (``backend.incidents.follow_up``) and the activation-swap
loop (``backend.swap.loop``), then, after the commit,
the webhook sends (``backend.alerts.tasks.queue_deliveries``). A per-job Redis lock keeps
two workers off the same job; embedded mode calls the same functions from its ticker.
"""

from __future__ import annotations

import logging
import time

from backend.alerts.tasks import queue_deliveries
from backend.celery_app import Runtime, redis_lock, runtime, vigil_task
from backend.db import session_scope
from backend.detection import runner
from backend.detection.schedule import begin, queue_run, redundant, served
from backend.incidents.follow_up import follow_up
from backend.swap.loop import swap_follow_up

log = logging.getLogger(__name__)


@vigil_task("detect_job")
def detect_job(job_id: int, ticket: int | None = None) -> None:
    """Run the window detectors for one job and act on what changed, unless a run that
    began after this task was queued did already (``schedule.redundant``).

    The per-job lock is a lease renewed while the run lasts, so a worker killed mid-run
    blocks the job for two intervals at most, not for the task's time limit.
    """
    rt = runtime()
    if redundant(job_id, ticket):
        return
    lease_s = max(2.0, 2 * rt.settings.detect_interval_s)
    with redis_lock(f"detect:{job_id}", ttl_s=lease_s, renew=True) as got:
        if not got:  # another worker is on this job: come back after it
            queue_run(job_id)
            return
        started, seen = time.time(), begin(job_id)
        run_detection(rt, job_id)
        served(job_id, seen, started)


def run_detection(rt: Runtime, job_id: int) -> None:
    with session_scope(rt.factory, write=True) as session:
        changes = runner.detect_job(
            session=session, job_id=job_id, width=rt.settings.detect_window_steps
        )
        deliveries = follow_up(session=session, changes=changes, settings=rt.settings)
        swap_follow_up(session=session, job_id=job_id, settings=rt.settings)
    queue_deliveries(deliveries)


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
                deliveries = follow_up(session=session, changes=changes, settings=rt.settings)
            queue_deliveries(deliveries)
        except Exception:  # one bad job must not stop the sweep of the others
            log.exception("sweep of job %s failed", job_id)
