"""Read API for jobs: list, one job, its runs, steps and ranks. Needs a `read` token."""

from __future__ import annotations

import time
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query

from backend.auth.deps import require_scope
from backend.deps import RankQuery, RunQuery, SessionDep, StepQuery
from backend.errors import Invalid, NotFound, errors
from backend.jobs import service
from backend.jobs.runs import RunMap, require_run, run_map
from backend.jobs.runs import list_runs as runs_of
from backend.jobs.schemas import JobDetail, JobOut, RankOut, RunOut, StepOut, StepPage
from backend.telemetry.models import StepRecord

router = APIRouter(
    prefix="/api/v1/jobs", tags=["jobs"], dependencies=[Depends(require_scope("read"))]
)


@router.get("", response_model=list[JobOut])
def list_jobs(session: SessionDep) -> Any:
    return service.list_jobs(session=session)


@router.get("/{job}", response_model=JobDetail, responses=errors(404))
def get_job(job: str, session: SessionDep) -> Any:
    found = service.get_job(session=session, name=job)
    if found is None:
        raise NotFound(f"job {job!r} not found")
    return found


@router.get("/{job}/steps", response_model=StepPage, responses=errors(404))
def list_steps(
    job: str,
    session: SessionDep,
    rank: RankQuery = None,
    from_step: StepQuery = None,
    to_step: StepQuery = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
    cursor: Annotated[str | None, Query(description="`next_cursor` of the previous page")] = None,
    run: RunQuery = None,
) -> Any:
    """Step records ordered by (step, rank), each with its run's number and the attempt
    within that run. Follow `next_cursor` until it is null."""
    if from_step is not None and to_step is not None and from_step > to_step:
        raise Invalid("from_step must not be greater than to_step")
    try:
        after = service.StepCursor.decode(cursor) if cursor else None
    except ValueError as exc:
        raise Invalid(f"cursor: {exc}") from None
    job_id = service.require_job_id(session=session, name=job)
    runs = run_map(session=session, job_id=job_id)
    only = None
    if run is not None:
        only = require_run(session=session, job_id=job_id, job=job, number=run)
    rows, nxt = service.list_steps(
        session=session,
        job_id=job_id,
        rank=rank,
        from_step=from_step,
        to_step=to_step,
        limit=limit,
        after=after,
        run=only,
    )
    return StepPage(
        items=[_step_out(r, runs) for r in rows], next_cursor=nxt.encode() if nxt else None
    )


def _step_out(row: StepRecord, runs: RunMap) -> StepOut:
    out = StepOut.model_validate(row, from_attributes=True)
    owner, out.attempt = runs.locate(row.attempt)
    out.run = owner.number if owner is not None else None
    return out


@router.get("/{job}/runs", response_model=list[RunOut], responses=errors(404))
def list_runs(job: str, session: SessionDep) -> Any:
    """The job's runs (each launch of its name), newest first, with their state: running,
    finished (every rank said goodbye cleanly), failed (a failing exit code) or lost
    (ranks stopped reporting without a goodbye), and why it ended."""
    job_id = service.require_job_id(session=session, name=job)
    return [service.run_out(r) for r in runs_of(session=session, job_id=job_id)]


@router.get("/{job}/ranks", response_model=list[RankOut], responses=errors(404))
def list_ranks(job: str, session: SessionDep) -> Any:
    """Each rank's latest state: steps, heartbeat age, the collective it is inside."""
    job_id = service.require_job_id(session=session, name=job)
    return service.list_ranks(session=session, job_id=job_id, now=time.time())
