"""Goodput over REST: how much of a job's wall time made progress, and where the rest went.

GET /api/v1/jobs/llama-8b-pretrain/goodput      (a `read` token)
{"job": "llama-8b-pretrain", "total_s": 192.0, "productive_s": 100.0, "goodput": 0.52,
 "badput": {"wasted_progress": 30.0, "disruption_recovery": 60.0, ...},
 "restarts": 1, "steps_lost": 30, "as_of": "2024-11-22T00:03:12Z"}
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends

from backend.auth.deps import require_scope
from backend.deps import SessionDep
from backend.errors import NotFound, errors
from backend.goodput import service
from backend.goodput.schemas import GoodputOut
from backend.jobs.service import get_job_id

router = APIRouter(
    prefix="/api/v1", tags=["goodput"], dependencies=[Depends(require_scope("read"))]
)


@router.get("/jobs/{job}/goodput", response_model=GoodputOut, responses=errors(404))
def job_goodput(job: str, session: SessionDep) -> Any:
    """Productive time against time lost (wasted steps, restarts, hangs, stragglers, data
    waits, checkpoints), from the job's first step to its last activity."""
    job_id = get_job_id(session=session, name=job)
    found = None if job_id is None else service.job_goodput(session=session, job_id=job_id)
    if found is None:
        raise NotFound(f"job {job!r} not found")
    return found
