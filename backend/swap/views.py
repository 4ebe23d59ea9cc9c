"""``GET /api/v1/jobs/{job}/swap``: a job's shape fingerprints and activation-swap policies.
Needs a `read` token, like the other job reads."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends

from backend.auth.deps import require_scope
from backend.deps import SessionDep
from backend.errors import errors
from backend.jobs.service import require_job_id
from backend.swap.report import job_swap
from backend.swap.schemas import JobSwapOut

router = APIRouter(
    prefix="/api/v1/jobs", tags=["swap"], dependencies=[Depends(require_scope("read"))]
)


@router.get("/{job}/swap", response_model=JobSwapOut, responses=errors(404))
def get_swap(job: str, session: SessionDep) -> Any:
    """Op-sequence versions over steps, every policy made for them, the active version."""
    return job_swap(session=session, job_id=require_job_id(session=session, name=job))
