"""Recovery over REST: approve or cancel actions, set policies.

    curl -X PUT -H "Authorization: Bearer $ADMIN" $VIGIL/api/v1/jobs/llama/policies/straggler \\
         -d '{"mode": "auto", "params": {"allow_evict": true, "horizon_s": 36000}}'
    curl -X POST -H "Authorization: Bearer $ADMIN" $VIGIL/api/v1/jobs/llama/actions/12/approve

Changing things needs an `admin` token, reading a `read` token. Mounted as ``router``.
The audit trail these write is read at ``/api/v1/jobs/{job}/audit`` (``backend.audit.views``).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Request
from sqlalchemy.orm import Session

from backend.actions.schemas import ActionOut
from backend.actions.views import action_out
from backend.auth.deps import require_scope
from backend.auth.service import Principal
from backend.deps import RowId, SessionDep
from backend.errors import Invalid, NotFound, error_response, errors
from backend.jobs.service import require_job_id
from backend.recovery import service
from backend.recovery.models import RecoveryPolicy
from backend.recovery.policies import ANY
from backend.recovery.schemas import DecisionIn, PolicyIn, PolicyOut

router = APIRouter(prefix="/api/v1", tags=["recovery"])

Admin = Annotated[Principal, Depends(require_scope("admin"))]
READ = [Depends(require_scope("read"))]


def _policy_out(row: RecoveryPolicy) -> PolicyOut:
    columns = {c.key: getattr(row, c.key) for c in RecoveryPolicy.__table__.columns}
    return PolicyOut.model_validate(columns)


def _decide(
    request: Request,
    session: Session,
    job: str,
    action_id: int,
    body: DecisionIn | None,
    principal: Principal,
    *,
    approve: bool,
) -> Any:
    body = body or DecisionIn()
    job_id = require_job_id(session=session, name=job)
    actor = f"api:{principal.name}"
    try:
        if approve:
            action = service.approve(
                session=session,
                action_id=action_id,
                actor=actor,
                settings=request.app.state.settings,
                force=body.force,
                note=body.note,
                job_id=job_id,
            )
        else:
            action = service.cancel(
                session=session, action_id=action_id, actor=actor, note=body.note, job_id=job_id
            )
    except service.NotFound:
        raise NotFound(f"action {action_id} not found in job {job!r}") from None
    except service.GuardBlocked as exc:
        # Returned, not raised: the refusal's audit entry commits with the response.
        return error_response(exc)
    return action_out(action, job)


@router.post(
    "/jobs/{job}/actions/{action_id}/approve",
    response_model=ActionOut,
    responses=errors(
        404,
        409,
        e409="Not proposed, expired, its run has no live rank, or a guard blocks it (`guards`)",
    ),
)
def approve_action(
    job: str,
    action_id: RowId,
    request: Request,
    session: SessionDep,
    principal: Admin,
    body: Annotated[DecisionIn | None, Body()] = None,
) -> Any:
    """Release a proposed action to the job's ranks. 409 when it is not proposed, when no
    rank could receive it (the job's run ended, none of its ranks reports, or the action
    was made for an earlier run), or when the cooldown or hourly cap blocks it (send
    `{"force": true}` to override the guards)."""
    return _decide(request, session, job, action_id, body, principal, approve=True)


@router.post(
    "/jobs/{job}/actions/{action_id}/cancel", response_model=ActionOut, responses=errors(404, 409)
)
def cancel_action(
    job: str,
    action_id: RowId,
    request: Request,
    session: SessionDep,
    principal: Admin,
    body: Annotated[DecisionIn | None, Body()] = None,
) -> Any:
    """Cancel an open action (proposed, pending, dispatched or acked); 409 when it is
    already over. Ranks that already received it may have run it."""
    return _decide(request, session, job, action_id, body, principal, approve=False)


def _put(session: Session, job: str, kind: str, body: PolicyIn, principal: Principal) -> Any:
    row, _ = service.put_policy(
        session=session,
        job=job,
        kind=kind,
        mode=body.mode,
        actor=f"api:{principal.name}",
        actions=body.actions,
        params=body.params.model_dump(exclude_none=True),
    )
    return _policy_out(row)


@router.get("/jobs/{job}/policies", response_model=list[PolicyOut], dependencies=READ)
def list_job_policies(job: str, session: SessionDep) -> Any:
    """Policies set for this job (the job need not have reported yet); the defaults for
    every job are at `/api/v1/policies`."""
    return [_policy_out(r) for r in service.list_policies(session=session, job=job)]


@router.put("/jobs/{job}/policies/{kind}", response_model=PolicyOut)
def put_job_policy(
    job: str, kind: str, body: PolicyIn, session: SessionDep, principal: Admin
) -> Any:
    """Set how incidents of `kind` (or `*`: every kind) in this job are handled:
    `auto` acts, `approve` proposes and waits for a person, `off` does nothing."""
    if job == ANY:
        raise Invalid("job: '*' is the default for every job: use /api/v1/policies")
    return _put(session, job, kind, body, principal)


@router.get("/policies", response_model=list[PolicyOut], dependencies=READ)
def list_default_policies(session: SessionDep) -> Any:
    """The defaults for every job, per incident kind (`*`: every kind)."""
    return [_policy_out(r) for r in service.list_policies(session=session, job=ANY)]


@router.put("/policies/{kind}", response_model=PolicyOut)
def put_default_policy(kind: str, body: PolicyIn, session: SessionDep, principal: Admin) -> Any:
    """Set the default for every job; a job's own policy for the kind takes precedence."""
    return _put(session, ANY, kind, body, principal)
