"""People handling incidents: acknowledge, resolve by hand, and how long one was open.

    acknowledge(session=s, incident=row, actor="api:alice")        # who, when; audited
    unacknowledge(session=s, incident=row, actor="api:alice")
    ids = resolve_by_hand(session=s, incident=row, actor="ui:bob", note="node drained",
                          public_url=settings.public_url)          # delivery ids to queue
    open_for_s(row, now=utcnow())

Acknowledging says "someone is on it": the incident stays open and is still shown and
resolved as usual, but gets no reminder notifications (``repeat_interval``). It lasts until
it is taken back or the incident is resolved.

Resolving by hand closes the incident with the person and a note, sends ``resolved`` to
the receivers told it fired, cancels its actions still only proposed, and *holds* the
episode: the detectors key an incident by its finding's key (``<job id>:<key>``, e.g.
``straggler:6``), so the next detection run would see the same condition and re-open it.
The rule is ``backend.incidents.holds``'s (used by ``apply_findings``).

Each change is audited on the job: ``acknowledged``, ``unacknowledged``, ``resolved``.
Services only flush; ``Conflict`` (409) for what the incident's state does not allow.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from backend.actions.models import Action
from backend.actions.service import cancel
from backend.alerts.service import notify_changes
from backend.audit.service import audit
from backend.db import utcnow
from backend.errors import Conflict, Invalid
from backend.incidents.models import Incident

MAX_NOTE_CHARS = 2000


def acknowledge(
    *,
    session: Session,
    incident: Incident,
    actor: str,
    note: str = "",
    now: datetime | None = None,
) -> Incident:
    """Mark an open incident acknowledged by ``actor`` (again: unchanged, not re-audited);
    a ``note`` ("looking at node 7") is kept in the audit entry."""
    if incident.status != "open":
        raise Conflict(f"incident {incident.id} is {incident.status}: nothing to acknowledge")
    if incident.acked_at is not None:
        return incident
    now = now or utcnow()
    incident.acked_at, incident.acked_by = now, actor[:128]
    note = note.strip()
    _audit(session, incident, actor, "acknowledged", now, {"note": note} if note else None)
    return incident


def unacknowledge(
    *, session: Session, incident: Incident, actor: str, now: datetime | None = None
) -> Incident:
    """Take an acknowledgement back (reminders resume); a no-op if there is none."""
    if incident.acked_at is None:
        return incident
    now = now or utcnow()
    detail = {"was_acked_by": incident.acked_by, "acked_at": incident.acked_at.isoformat()}
    incident.acked_at, incident.acked_by = None, None
    _audit(session, incident, actor, "unacknowledged", now, detail)
    return incident


def resolve_by_hand(
    *,
    session: Session,
    incident: Incident,
    actor: str,
    note: str,
    public_url: str,
    now: datetime | None = None,
) -> list[int]:
    """Resolve an open incident with a note; returns the ids of the ``resolved``
    deliveries to queue once committed. ``Invalid`` without a note, ``Conflict`` if it is
    resolved already."""
    note = note.strip()
    if not note:
        raise Invalid("note: say why the incident is resolved")
    if len(note) > MAX_NOTE_CHARS:
        raise Invalid(f"note: at most {MAX_NOTE_CHARS} characters")
    if incident.status != "open":
        by = f" by {incident.resolved_by}" if incident.resolved_by else ""
        raise Conflict(f"incident {incident.id} is resolved already{by}")
    now = now or utcnow()
    incident.status, incident.resolved_at, incident.updated_at = "resolved", now, now
    incident.resolved_by, incident.resolution_note = actor[:128], note
    incident.held = True
    _audit(session, incident, actor, "resolved", now, {"note": note})
    _withdraw_proposals(session, incident, actor, now)
    deliveries = notify_changes(
        session=session, opened=[], resolved=[incident], now=now, public_url=public_url
    )
    return [d.id for d in deliveries]


def _audit(
    session: Session,
    incident: Incident,
    actor: str,
    event: str,
    now: datetime,
    detail: dict[str, Any] | None = None,
) -> None:
    """Flush the change and append its audit entry, on the incident's job."""
    session.flush()
    audit(
        session=session,
        job_id=incident.job_id,
        incident_id=incident.id,
        actor=actor,
        event=event,
        detail=detail,
        at=now,
    )


def _withdraw_proposals(session: Session, incident: Incident, actor: str, now: datetime) -> None:
    """Cancel the incident's actions still waiting for approval: nothing to approve now.
    Approved ones (pending or further) are left to run: a person chose them."""
    proposed = session.scalars(
        select(Action.id).where(Action.incident_id == incident.id, Action.state == "proposed")
    ).all()
    for action_id in proposed:
        cancel(
            session=session,
            action_id=action_id,
            actor=actor,
            note=f"incident {incident.id} was resolved by hand",
            now=now,
        )


def open_for_s(incident: Incident, now: datetime) -> float:
    """Seconds from detection to resolution, or to ``now`` while it is open."""
    end = incident.resolved_at if incident.resolved_at is not None else now
    return max((end - incident.detected_at).total_seconds(), 0.0)


def duration_text(seconds: float) -> str:
    """``95`` → ``1 min 35 s``; ``7500`` → ``2 h 5 min``; ``200000`` → ``2 d 7 h``."""
    s = int(seconds)
    days, hours, minutes = s // 86400, s % 86400 // 3600, s % 3600 // 60
    if days:
        return f"{days} d {hours} h"
    if hours:
        return f"{hours} h {minutes} min"
    if minutes:
        return f"{minutes} min {s % 60} s"
    return f"{s} s"
