"""The audit trail over REST: what the policy, people and ranks did, newest first.

    curl -H "Authorization: Bearer $READ" "$VIGIL/api/v1/jobs/llama/audit?action_id=12"
    curl -H "Authorization: Bearer $READ" $VIGIL/api/v1/audit     # entries tied to no job

Reading needs a `read` token. Mounted as ``router``.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query

from backend.audit import service
from backend.audit.models import AuditEntry
from backend.audit.schemas import AuditOut
from backend.auth.deps import require_scope
from backend.deps import RowIdQuery, SessionDep
from backend.errors import errors
from backend.jobs.service import require_job_id

router = APIRouter(prefix="/api/v1", tags=["audit"])

READ = [Depends(require_scope("read"))]


def _audit_out(row: AuditEntry, job: str | None) -> AuditOut:
    columns = {c.key: getattr(row, c.key) for c in AuditEntry.__table__.columns}
    return AuditOut.model_validate({**columns, "job": job})


@router.get(
    "/jobs/{job}/audit", response_model=list[AuditOut], dependencies=READ, responses=errors(404)
)
def list_job_audit(
    job: str,
    session: SessionDep,
    action_id: RowIdQuery = None,
    incident_id: RowIdQuery = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 200,
) -> Any:
    """What the policy, people and ranks did about this job's incidents, newest first."""
    job_id = require_job_id(session=session, name=job)
    rows = service.list_audit(
        session=session,
        job_id=job_id,
        action_id=action_id,
        incident_id=incident_id,
        limit=limit,
    )
    return [_audit_out(r, job) for r in rows]


@router.get("/audit", response_model=list[AuditOut], dependencies=READ)
def list_global_audit(
    session: SessionDep, limit: Annotated[int, Query(ge=1, le=1000)] = 200
) -> Any:
    """Audit entries tied to no job: changes to the defaults, policies set for jobs that
    had not reported yet."""
    rows = service.list_audit(session=session, job_id=None, limit=limit)
    return [_audit_out(r, None) for r in rows]
