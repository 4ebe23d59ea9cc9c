"""The audit trail: one append-only row per thing that happened to recovery.

    audit(session=session, job_id=7, actor="policy", event="proposed", action_id=12,
          incident_id=40, detail={"kind": "restart"})
    list_audit(session=session, job_id=7, action_id=12)   # newest first

Actors: ``policy`` (the recovery policy), ``api:<token name>`` (a person over REST),
``rank:<n>`` (a rank reporting on an action), ``system`` (periodic sweeps). Events:
``created``, ``proposed``, ``approved``, ``cancelled``, ``expired``, ``blocked``,
``skipped``, ``no_action``, ``error``, ``policy_set``, and the states ranks report
(``acked``, ``succeeded``, ``failed``); people handling incidents
(``backend.incidents.handling``, ``backend.alerts.silences``): ``acknowledged``,
``unacknowledged``, ``resolved``, ``silence_created``, ``silence_expired``. An action's
state changes are written by :func:`backend.actions.states.transition`, never by hand.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from backend.audit.models import AuditEntry
from backend.db import utcnow


def audit(
    *,
    session: Session,
    job_id: int | None,
    actor: str,
    event: str,
    action_id: int | None = None,
    incident_id: int | None = None,
    detail: dict[str, Any] | None = None,
    at: datetime | None = None,
) -> AuditEntry:
    """Append one entry (``actor`` and ``event`` are cut to their column widths)."""
    entry = AuditEntry(
        job_id=job_id,
        action_id=action_id,
        incident_id=incident_id,
        at=at or utcnow(),
        actor=actor[:128],
        event=event[:32],
        detail=detail or {},
    )
    session.add(entry)
    session.flush()
    return entry


def list_audit(
    *,
    session: Session,
    job_id: int | None,
    action_id: int | None = None,
    incident_id: int | None = None,
    limit: int = 200,
) -> list[AuditEntry]:
    """A job's audit entries, newest first (``job_id=None``: entries tied to no job)."""
    query = select(AuditEntry).where(
        AuditEntry.job_id.is_(None) if job_id is None else AuditEntry.job_id == job_id
    )
    if action_id is not None:
        query = query.where(AuditEntry.action_id == action_id)
    if incident_id is not None:
        query = query.where(AuditEntry.incident_id == incident_id)
    query = query.order_by(AuditEntry.at.desc(), AuditEntry.id.desc()).limit(limit)
    return list(session.scalars(query))
