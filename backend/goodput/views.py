"""Goodput over REST: how much of a job's wall time made progress, and where the rest went.

GET /api/v1/jobs/llama-8b-pretrain/goodput      (a `read` token; `?run=2`: that run alone)
{"job": "llama-8b-pretrain", "total_s": 192.0, "productive_s": 100.0, "goodput": 0.52,
 "badput": {"wasted_progress": 30.0, "disruption_recovery": 60.0, ...},
 "restarts": 1, "steps_lost": 30, "as_of": "2024-11-22T00:03:12Z"}
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends

from backend.auth.deps import require_scope
from backend.deps import RunQuery, SessionDep
from backend.errors import NotFound, errors
from backend.goodput import service
from backend.goodput.schemas import GoodputOut
from backend.jobs.runs import require_run
from backend.jobs.service import require_job_id

router = APIRouter(
    prefix="/api/v1", tags=["goodput"], dependencies=[Depends(require_scope("read"))]
)


@router.get("/jobs/{job}/goodput", response_model=GoodputOut, responses=errors(404))
def job_goodput(
    job: str,
    session: SessionDep,
    run: RunQuery = None,
) -> Any:
    """Productive time against time lost (wasted steps, restarts, hangs, stragglers, data
    waits, checkpoints, downtime between runs), from the job's first step to its last
    activity; with `run`, that run alone."""
    job_id = require_job_id(session=session, name=job)
    if run is not None:
        require_run(session=session, job_id=job_id, job=job, number=run)
    found = service.job_goodput(session=session, job_id=job_id, run=run)
    if found is None:
        raise NotFound(f"job {job!r} not found")
    return found
