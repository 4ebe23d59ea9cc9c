"""The end of a run: judged by the sweep, then its open incidents and actions settled.

Each sweep, for each job (``backend.detection.runner.sweep_job``), :func:`settle_runs`

1. judges the current run from its ranks (``backend.jobs.runs.judge``) and ends it when
   every rank is gone; a run that waited behind it and never took over is ended too;
2. settles every ended run not settled yet (one a later launch took over is ended by
   ingest, ``backend.jobs.launches``, and settled here), and again the current run after
   it ended, for what detection of its last data opened since:

   - its open incidents (a training run's: a serving
     job's follow its traffic and resolve by detection) are resolved, as fits the kind:
     a hang or crash in a run whose ranks all then exited cleanly is resolved as such
     ("the run finished cleanly"); any other is resolved "ended with the run", with the
     run's number and state in ``evidence.ended_with_run``;
   - its actions still open (proposed, pending, dispatched, acked) expire, with the reason
     in ``result.expired_because`` and the audit trail: no process of the run is left to
     run them, and a restart nobody can carry out must not wait forever.

The incidents it resolves are returned, so the sweep's follow-up notifies receivers of them.

    resolved = settle_runs(session=s, job_id=7, now=utcnow())
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from backend.actions.models import Action
from backend.actions.service import expire_for
from backend.incidents.models import Incident
from backend.incidents.service import fingerprint
from backend.jobs.models import Job, Run
from backend.jobs.runs import (
    ATTEMPTS_PER_RUN,
    ENDED_STATES,
    RELAUNCH_QUIET_S,
    Verdict,
    attempt_ranks,
    end_run,
    judge,
)

OPEN_ACTION_STATES = ("proposed", "pending", "dispatched", "acked")
DOWN_KINDS = ("hang", "crash")


def settle_runs(*, session: Session, job_id: int, now: datetime) -> list[Incident]:
    """Judge the job's current run, end what is over, settle what ended; returns the
    incidents resolved because their run ended."""
    job = session.get(Job, job_id)
    if job is None or job.run_id is None:
        return []
    runs = list(
        session.scalars(
            select(Run)
            .where(Run.job_id == job_id, or_(Run.state == "running", Run.closed_at.is_(None)))
            .order_by(Run.number)
        )
    )
    current = session.get(Run, job.run_id)
    if current is not None and current.state == "running":
        ranks = attempt_ranks(session=session, job_id=job_id, attempt=job.attempt)
        verdict = judge(ranks, now=now)
        if verdict.state in ENDED_STATES:
            end_run(run=current, verdict=verdict, now=now)
    for run in runs:
        if run.state == "running" and current is not None and run.id != current.id:
            _end_stranded(run, current, now)
    resolved: list[Incident] = []
    for run in runs:
        if run.state in ENDED_STATES and run.closed_at is None:
            resolved += close_run(session=session, run=run, now=now)
    if current is not None and current.closed_at is not None and current.closed_at < now:
        # Detection may still judge an ended run's last data (a replay's whole trace
        # arrives just before its goodbyes): what it opens ends with the run too.
        resolved += close_run(session=session, run=current, now=now)
    session.flush()
    return resolved


def _end_stranded(run: Run, current: Run, now: datetime) -> None:
    """A run that is neither current nor ended: one a later run replaced without ending it
    (not by ingest, which always ends it), or a new launch that waited behind the current
    run and stopped before that ended, so it never took over."""
    if run.number < current.number:
        end_run(run=run, verdict=Verdict("lost", f"run #{current.number} took over"), now=now)
        return
    quiet = now - timedelta(seconds=RELAUNCH_QUIET_S)
    if current.state != "running" and current.ended_at is not None and current.ended_at < quiet:
        reason = (
            f"it started while run #{current.number} still reported and stopped before "
            "that run ended, so it never became the job's current run"
        )
        end_run(run=run, verdict=Verdict("lost", reason), now=now)


def close_run(*, session: Session, run: Run, now: datetime) -> list[Incident]:
    """Resolve the ended run's open incidents (the run's by their fingerprint,
    ``backend.incidents.service.fingerprint``) and expire its open actions (the run's by
    their attempt); mark it settled."""
    scope = fingerprint(run.job_id, "", run.number)
    label = f"run #{run.number} {run.state}" + (f": {run.reason}" if run.reason else "")
    # A serving job's incidents follow its traffic (burn rates move with the clock), not
    # its processes: they resolve by detection.
    incidents = (
        []
        if run.kind == "serving"
        else list(
            session.scalars(
                select(Incident).where(
                    Incident.job_id == run.job_id,
                    Incident.status == "open",
                    Incident.fingerprint.startswith(scope, autoescape=True),
                )
            )
        )
    )
    for row in incidents:
        if row.kind in DOWN_KINDS and run.state == "finished":
            because = f"the run finished cleanly ({label})"
        else:
            because = f"ended with the run ({label})"
        row.status, row.resolved_at, row.updated_at = "resolved", now, now
        row.evidence = {
            **(row.evidence or {}),
            "resolved_because": because,
            "ended_with_run": {"run": run.number, "state": run.state},
        }
    actions = session.scalars(
        select(Action)
        .where(
            Action.job_id == run.job_id,
            Action.state.in_(OPEN_ACTION_STATES),
            Action.attempt >= run.first_attempt,
            Action.attempt < run.first_attempt + ATTEMPTS_PER_RUN,
        )
        .order_by(Action.id)
        .with_for_update()
    )
    for action in actions:
        expire_for(
            session=session,
            action=action,
            reason=f"no process is left to run it: {label}",
            now=now,
        )
    run.closed_at = now
    return incidents
