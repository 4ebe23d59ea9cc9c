"""Run the registered detectors on a job and apply their findings as incidents.

Two kinds of run, told apart only by the window parts they load (``detectors.window``);
which detectors run is the registry's business (``detectors.registry``):

- ``detect_job`` after new data: ``steps``, ``collectives`` and ``opseq`` (stragglers,
  numerics, slowdowns, slow links, memory, op-sequence drift, …), and ``serving`` for
  serving jobs (burn rates, slow replicas);
- ``sweep_job`` on a timer: ``liveness`` (hangs and crashes, which show as the *absence*
  of data), and ``serving`` again: burn rates move with the clock, so a page resolves
  when its short window recovers even if no request arrives.

Each detector is isolated: one that raises is logged with the job and its name, counted in
``vigil_detector_failures_total``, and its incidents are left as they are (neither opened
nor resolved by omission) while the other detectors' findings apply. Every run is counted in
``vigil_detector_runs_total{detector,outcome}`` (in distributed mode via Redis, so the
API's ``/metrics`` shows what the workers ran). Both take a session
and leave commit to the caller.
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from backend.db import utcnow
from backend.detection import baselines, history
from backend.detection.collectives import load_collectives
from backend.detection.opseq import load_opseq
from backend.detection.window import live_ranks, load_liveness, load_serving, load_steps
from backend.incidents.service import Changes, apply_findings
from backend.jobs.models import Job, Rank, Run
from backend.jobs.run_end import settle_runs
from backend.jobs.runs import run_over
from backend.metrics import DETECTOR_FAILURES, DETECTOR_RUNS
from backend.telemetry.liveness import blind_spot, flush_quiet, live_states
from detectors import registry
from detectors.settle import settled
from detectors.window import Window

log = logging.getLogger(__name__)


def detect_job(
    *, session: Session, job_id: int, width: int = 200, now: float | None = None
) -> Changes:
    """The window detectors, over the job's last ``width`` steps (the slowdown detector
    also over the steps before them, when those ``width`` last under ``view_s``:
    ``backend.detection.history``), and, for a serving job, its recent minutes up to
    ``now``."""
    now = time.time() if now is None else now
    serving = load_serving(session=session, job_id=job_id, now=now)
    steps = load_steps(session=session, job_id=job_id, width=width)
    job = session.get(Job, job_id) if steps is not None else None
    if steps is not None and job is not None:
        # Judge only steps enough live ranks have reported (batches arrive out of step),
        # with each rank's normal speed as kept across runs, and, where the window is
        # short in seconds, the job's step time before it (the slowdown's longer view).
        steps = settled(steps, live_ranks=live_ranks(session=session, job=job))
        if steps.steps.size:
            steps = baselines.attach(job=job, window=steps, redis=_shared_redis())
            # A rank its open straggler incident names stays named at the hold level.
            steps = baselines.attach_named(session=session, job=job, window=steps)
            steps = history.attach(session=session, job=job, window=steps)
        else:
            steps = None  # nothing settled yet
    collectives = load_collectives(session=session, job_id=job_id, window=steps) if steps else None
    opseq = load_opseq(session=session, job_id=job_id, window=steps) if steps else None
    window = Window(steps=steps, collectives=collectives, serving=serving, opseq=opseq)
    if not window.parts:
        return Changes()
    return run_window(session=session, job_id=job_id, window=window)


def sweep_job(*, session: Session, job_id: int, now: float) -> Changes:
    """The job's runs first (``backend.jobs.run_end``: the current one ends when every
    rank is gone, an ended run's open incidents resolve and its actions expire), then the
    liveness detectors at time ``now``, while the run has not ended. With every rank gone
    (each said goodbye) nothing hangs or crashed, and open hangs and crashes resolve.
    First, in distributed mode, the last state of ranks that fell silent goes from Redis
    to their SQL rows (``backend.telemetry.liveness.flush_quiet``), so the run's life
    cycle judges them on it; and while the ranks' latest state cannot be seen whole
    (``liveness.blind_spot``: Redis unreadable, or it lost data) hangs and crashes are
    left as they are for this sweep."""
    live = live_states(job_id)
    flush_quiet(session=session, job_id=job_id, now=now, states=live or {})
    ended = settle_runs(session=session, job_id=job_id, now=datetime.fromtimestamp(now, UTC))
    over = run_over(session=session, job_id=job_id)
    blind = None if over else blind_spot(session=session, job_id=job_id, states=live, now=now)
    if blind:
        log.info("job %s: hangs and crashes not judged this sweep: %s", job_id, blind)
    liveness = (
        None if over or blind else load_liveness(session=session, job_id=job_id, now=now, live=live)
    )
    serving = load_serving(session=session, job_id=job_id, now=now)
    window = Window(liveness=liveness, serving=serving)
    changes = (
        run_window(session=session, job_id=job_id, window=window) if window.parts else Changes()
    )
    changes.resolved.extend(ended)
    return changes


def run_window(*, session: Session, job_id: int, window: Window) -> Changes:
    """Run every detector the window can feed and apply what they found."""
    result = registry.run(window)
    failed = {f.detector for f in result.failures}
    redis = _shared_redis()
    for name in result.ran:
        DETECTOR_RUNS.record(name, "failed" if name in failed else "ok", redis)
    for failure in result.failures:
        DETECTOR_FAILURES.labels(failure.detector).inc()
        job = session.scalar(select(Job.name).where(Job.id == job_id))
        log.error(
            "detector %s failed on job %s (id %s); its incidents are left as they were",
            failure.detector,
            job,
            job_id,
            exc_info=failure.error,
        )
    return apply_findings(
        session=session, job_id=job_id, findings=result.findings, covered_kinds=result.covered
    )


def _shared_redis() -> object | None:
    """Distributed mode's Redis, where detector runs are counted for the API's /metrics."""
    from backend.celery_app import runtime  # the runtime imports this module's callers

    try:
        return runtime().redis
    except Exception:  # no runtime configured (a bare library use): count locally only
        return None


def active_jobs(*, session: Session, within_s: float = 3600) -> list[int]:
    """Jobs that reported within ``within_s``, and jobs whose current run has not ended
    (however long ago they reported, a sweep must end it): the ones a sweep looks at."""
    since = utcnow() - timedelta(seconds=within_s)
    recent = select(Rank.job_id).where(Rank.last_seen_at >= since)
    running = select(Job.id).join(Run, Run.id == Job.run_id).where(Run.state == "running")
    return sorted(set(session.scalars(recent.distinct())) | set(session.scalars(running)))
