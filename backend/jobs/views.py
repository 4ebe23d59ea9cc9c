"""Read API for jobs: list, one job, its steps and its ranks. Needs a `read` token."""

from __future__ import annotations

import time
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query

from backend.auth.deps import require_scope
from backend.deps import RankQuery, SessionDep, StepQuery
from backend.errors import Invalid, NotFound, errors
from backend.jobs import service
from backend.jobs.schemas import JobDetail, JobOut, RankOut, StepOut, StepPage

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
) -> Any:
    """Step records ordered by (step, rank). Follow `next_cursor` until it is null."""
    if from_step is not None and to_step is not None and from_step > to_step:
        raise Invalid("from_step must not be greater than to_step")
    try:
        after = service.StepCursor.decode(cursor) if cursor else None
    except ValueError as exc:
        raise Invalid(f"cursor: {exc}") from None
    rows, nxt = service.list_steps(
        session=session,
        job_id=service.require_job_id(session=session, name=job),
        rank=rank,
        from_step=from_step,
        to_step=to_step,
        limit=limit,
        after=after,
    )
    return StepPage(
        items=[StepOut.model_validate(r, from_attributes=True) for r in rows],
        next_cursor=nxt.encode() if nxt else None,
    )


@router.get("/{job}/ranks", response_model=list[RankOut], responses=errors(404))
def list_ranks(job: str, session: SessionDep) -> Any:
    """Each rank's latest state: steps, heartbeat age, the collective it is inside."""
    job_id = service.require_job_id(session=session, name=job)
    return service.list_ranks(session=session, job_id=job_id, now=time.time())
