"""Incidents over REST: a job's incidents and one incident (a `read` token); acknowledge
and resolve by hand (an `admin` token, like every other change).

    curl -X POST $VIGIL/api/v1/incidents/42/ack -H "Authorization: Bearer $ADMIN" \\
         -d '{"note": "draining node 7"}'                      # the body is optional
    curl -X POST $VIGIL/api/v1/incidents/42/resolve -H "Authorization: Bearer $ADMIN" \\
         -d '{"note": "rank 6 node drained and replaced"}'
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, BackgroundTasks, Body, Depends, Query, Request

from backend.alerts.models import Silence
from backend.alerts.silences import active_silences, silencing
from backend.alerts.tasks import queue_deliveries
from backend.auth.deps import require_scope
from backend.auth.service import Principal
from backend.db import utcnow
from backend.deps import RowId, RunQuery, SessionDep
from backend.errors import NotFound, errors
from backend.incidents import handling, service
from backend.incidents.models import Incident
from backend.incidents.schemas import AckIn, IncidentOut, ResolveIn
from backend.jobs.models import Job
from backend.jobs.runs import require_run
from backend.jobs.service import require_job_id

router = APIRouter(
    prefix="/api/v1", tags=["incidents"], dependencies=[Depends(require_scope("read"))]
)
Admin = Annotated[Principal, Depends(require_scope("admin"))]


def to_out(
    row: Incident, job: str, *, now: datetime | None = None, silences: Sequence[Silence] = ()
) -> IncidentOut:
    """The incident as the API shows it; ``silences``: the active ones (to name those that
    mute it)."""
    now = now or utcnow()
    columns = {c.key: getattr(row, c.key) for c in Incident.__table__.columns}
    handled = {
        "silenced_by": [s.id for s in silencing(silences, row, job)]
        if row.status == "open"
        else [],
        "open_for_s": handling.open_for_s(row, now),
        "run": service.run_of(row.fingerprint),
    }
    return IncidentOut.model_validate({**columns, **handled, "job": job})


def _incident(session: SessionDep, incident_id: int) -> tuple[Incident, str]:
    row = service.get_incident(session=session, incident_id=incident_id)
    if row is None:
        raise NotFound(f"incident {incident_id} not found")
    job = session.get(Job, row.job_id)
    return row, job.name if job else ""


def _out(session: SessionDep, row: Incident, job: str) -> IncidentOut:
    now = utcnow()
    return to_out(row, job, now=now, silences=active_silences(session=session, now=now))


@router.get("/jobs/{job}/incidents", response_model=list[IncidentOut], responses=errors(404))
def list_incidents(
    job: str,
    session: SessionDep,
    status: Annotated[Literal["open", "resolved"] | None, Query()] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 200,
    run: RunQuery = None,
) -> Any:
    """The job's incidents, newest first; `run`: those opened in that run of the job."""
    job_id = require_job_id(session=session, name=job)
    if run is not None:
        require_run(session=session, job_id=job_id, job=job, number=run)
    rows = service.list_incidents(
        session=session, job_id=job_id, status=status, limit=limit, run=run
    )
    now = utcnow()
    silences = active_silences(session=session, now=now)
    return [to_out(r, job, now=now, silences=silences) for r in rows]


@router.get("/incidents/{incident_id}", response_model=IncidentOut, responses=errors(404))
def get_incident(incident_id: RowId, session: SessionDep) -> Any:
    return _out(session, *_incident(session, incident_id))


@router.post("/incidents/{incident_id}/ack", response_model=IncidentOut, responses=errors(404, 409))
def acknowledge(
    incident_id: RowId,
    session: SessionDep,
    principal: Admin,
    body: Annotated[AckIn | None, Body()] = None,
) -> Any:
    """Acknowledge an open incident: who and when are kept (and a `note`, in the audit
    trail), reminders stop. Again: no change. 409 if it is resolved."""
    row, job = _incident(session, incident_id)
    note = body.note if body is not None else ""
    handling.acknowledge(session=session, incident=row, actor=f"api:{principal.name}", note=note)
    return _out(session, row, job)


@router.delete("/incidents/{incident_id}/ack", response_model=IncidentOut, responses=errors(404))
def unacknowledge(incident_id: RowId, session: SessionDep, principal: Admin) -> Any:
    """Take the acknowledgement back (reminders resume)."""
    row, job = _incident(session, incident_id)
    handling.unacknowledge(session=session, incident=row, actor=f"api:{principal.name}")
    return _out(session, row, job)


@router.post(
    "/incidents/{incident_id}/resolve", response_model=IncidentOut, responses=errors(404, 409)
)
def resolve(
    incident_id: RowId,
    body: ResolveIn,
    request: Request,
    session: SessionDep,
    principal: Admin,
    background: BackgroundTasks,
) -> Any:
    """Resolve an open incident by hand, with a note: receivers told it fired hear it is
    resolved, its proposed actions are cancelled, and detection does not re-open it for
    the same episode (README, "Handling alerts"). 409 if it is resolved already."""
    row, job = _incident(session, incident_id)
    ids = handling.resolve_by_hand(
        session=session,
        incident=row,
        actor=f"api:{principal.name}",
        note=body.note,
        public_url=request.app.state.settings.public_url,
    )
    background.add_task(queue_deliveries, ids)  # after the commit
    return _out(session, row, job)
