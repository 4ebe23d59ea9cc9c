"""Recovery actions over REST: trigger by hand (admin token), list, inspect.

Approving and cancelling policy-made actions lives in ``backend.recovery.views``.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Response

from backend.actions import service
from backend.actions.models import Action
from backend.actions.schemas import ActionCreate, ActionOut
from backend.auth.deps import require_scope
from backend.auth.service import Principal
from backend.db import utcnow
from backend.deps import RowId, SessionDep
from backend.errors import NotFound, errors
from backend.incidents.models import Incident
from backend.jobs.runs import require_live
from backend.jobs.service import require_job_id

router = APIRouter(prefix="/api/v1", tags=["actions"])


def action_out(action: Action, job: str) -> ActionOut:
    columns = {c.key: getattr(action, c.key) for c in Action.__table__.columns}
    return ActionOut.model_validate({**columns, "job": job})


@router.post(
    "/jobs/{job}/actions",
    response_model=ActionOut,
    status_code=201,
    responses={
        200: {"model": ActionOut, "description": "The action made before with this key"},
        **errors(404, 409),
    },
)
def create_action(
    job: str,
    body: ActionCreate,
    session: SessionDep,
    response: Response,
    principal: Annotated[Principal, Depends(require_scope("admin"))],
) -> Any:
    """Trigger an action on the job's ranks. Ranks receive it in their next ingest reply.
    A repeated `idempotency_key` returns the existing action with 200. 404 for an
    `incident_id` that is not one of the job's; 409 when no rank could receive it: the
    job's run ended, or none of its ranks is reporting."""
    job_id = require_job_id(session=session, name=job)
    if body.incident_id is not None:
        incident = session.get(Incident, body.incident_id)
        if incident is None or incident.job_id != job_id:
            raise NotFound(f"incident {body.incident_id} not found in job {job!r}")
    require_live(session=session, job_id=job_id, now=utcnow())
    action, created = service.create_action(
        session=session,
        job_id=job_id,
        kind=body.kind,
        requested_by=f"api:{principal.name}",
        target_ranks=body.target_ranks,
        params=body.params,
        reason=body.reason,
        idempotency_key=body.idempotency_key,
        ttl_s=body.ttl_s,
        incident_id=body.incident_id,
    )
    if not created:
        response.status_code = 200
    return action_out(action, job)


@router.get(
    "/jobs/{job}/actions",
    response_model=list[ActionOut],
    dependencies=[Depends(require_scope("read"))],
    responses=errors(404),
)
def list_actions(job: str, session: SessionDep) -> Any:
    """The job's actions, newest first, with per-rank delivery state."""
    job_id = require_job_id(session=session, name=job)
    return [action_out(a, job) for a in service.list_actions(session=session, job_id=job_id)]


@router.get(
    "/actions/{action_id}",
    response_model=ActionOut,
    dependencies=[Depends(require_scope("read"))],
    responses=errors(404),
)
def get_action(action_id: RowId, session: SessionDep) -> Any:
    from backend.jobs.models import Job

    action = service.get_action(session=session, action_id=action_id)
    if action is None:
        raise NotFound(f"action {action_id} not found")
    job = session.get(Job, action.job_id)
    return action_out(action, job.name if job else "")
