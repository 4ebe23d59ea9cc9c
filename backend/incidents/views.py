"""Incidents over REST: a job's incidents, and one incident. Needs a `read` token."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query

from backend.auth.deps import require_scope
from backend.deps import RowId, SessionDep
from backend.errors import NotFound, errors
from backend.incidents import service
from backend.incidents.models import Incident
from backend.incidents.schemas import IncidentOut
from backend.jobs.models import Job
from backend.jobs.service import require_job_id

router = APIRouter(
    prefix="/api/v1", tags=["incidents"], dependencies=[Depends(require_scope("read"))]
)


def to_out(row: Incident, job: str) -> IncidentOut:
    columns = {c.key: getattr(row, c.key) for c in Incident.__table__.columns}
    return IncidentOut.model_validate({**columns, "job": job})


@router.get("/jobs/{job}/incidents", response_model=list[IncidentOut], responses=errors(404))
def list_incidents(
    job: str,
    session: SessionDep,
    status: Annotated[Literal["open", "resolved"] | None, Query()] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 200,
) -> Any:
    """The job's incidents, newest first."""
    job_id = require_job_id(session=session, name=job)
    rows = service.list_incidents(session=session, job_id=job_id, status=status, limit=limit)
    return [to_out(r, job) for r in rows]


@router.get("/incidents/{incident_id}", response_model=IncidentOut, responses=errors(404))
def get_incident(incident_id: RowId, session: SessionDep) -> Any:
    row = service.get_incident(session=session, incident_id=incident_id)
    if row is None:
        raise NotFound(f"incident {incident_id} not found")
    job = session.get(Job, row.job_id)
    return to_out(row, job.name if job else "")
