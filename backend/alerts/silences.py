"""Silences: mute notifications for the incidents that match, until the silence expires.

    s = create_silence(session=session, matchers={"job": "llama-*", "kind": "straggler"},
                       ends_at=utcnow() + timedelta(hours=2), created_by="api:alice",
                       comment="rank 6's node is being drained")
    active = active_silences(session=session, now=utcnow())
    silencing(active, incident, "llama-8b")        # the silences that mute this incident
    expire_silence(session=session, silence_id=s.id, actor="api:alice")

Matchers (all given must match; at least one): ``job`` — the job's name, exactly, or a
glob with ``*`` and ``?``; ``kind`` and ``severity`` — equal; ``rank`` — the incident names
that rank. A silenced incident still opens, shows in the UI as silenced and resolves as
usual; what it does not get is a firing notification (nor reminders) while a silence that
matches it is active. When the silence ends, an incident still open is notified at the
next periodic pass (``backend.alerts.service.catch_up``). A resolved notification still
goes to a receiver that was told the incident fired.

Creating and expiring are audited (``silence_created``, ``silence_expired``; tied to the
job when the ``job`` matcher names one existing job exactly). Services only flush.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from fnmatch import fnmatchcase
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from backend.alerts.models import Silence
from backend.audit.service import audit
from backend.db import utcnow
from backend.errors import Conflict, Invalid, NotFound
from backend.incidents.models import INCIDENT_KINDS, SEVERITIES, Incident
from backend.jobs.models import Job

MATCHER_NAMES = ("job", "kind", "severity", "rank")
MAX_SILENCE = timedelta(days=365)
SILENCE_STATES = ("pending", "active", "expired")
GLOB_CHARS = frozenset("*?[")


def check_matchers(matchers: dict[str, Any]) -> dict[str, Any]:
    """The matchers without unset ones; ``Invalid`` naming the matcher that is wrong."""
    unknown = sorted(set(matchers) - set(MATCHER_NAMES))
    if unknown:
        raise Invalid(f"matchers: unknown {unknown}; known: {', '.join(MATCHER_NAMES)}")
    given = {k: v for k, v in matchers.items() if v is not None and v != ""}
    if not given:
        raise Invalid("matchers: give at least one of job, kind, severity, rank")
    job = given.get("job")
    if job is not None and (not isinstance(job, str) or len(job) > 200):
        raise Invalid("matchers.job: a job name or glob of at most 200 characters")
    if "kind" in given and given["kind"] not in INCIDENT_KINDS:
        raise Invalid(
            f"matchers.kind: unknown {given['kind']!r}; known: {', '.join(INCIDENT_KINDS)}"
        )
    if "severity" in given and given["severity"] not in SEVERITIES:
        known = ", ".join(SEVERITIES)
        raise Invalid(f"matchers.severity: unknown {given['severity']!r}; known: {known}")
    rank = given.get("rank")
    if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int) or rank < 0):
        raise Invalid("matchers.rank: a rank number, 0 or more")
    return given


def check_window(starts_at: datetime, ends_at: datetime, now: datetime) -> None:
    """``Invalid`` unless the silence ends in the future, after it starts, within a year."""
    for name, value in (("starts_at", starts_at), ("ends_at", ends_at)):
        if value.tzinfo is None:
            raise Invalid(f"{name}: give a time zone (e.g. 2026-11-24T18:00:00Z)")
    if ends_at <= now:
        raise Invalid("ends_at: the silence would already be over; give a time in the future")
    if ends_at <= starts_at:
        raise Invalid("ends_at: must be after starts_at")
    if ends_at - starts_at > MAX_SILENCE:
        raise Invalid("ends_at: a silence lasts at most 365 days")


def create_silence(
    *,
    session: Session,
    matchers: dict[str, Any],
    ends_at: datetime,
    created_by: str,
    starts_at: datetime | None = None,
    comment: str = "",
    now: datetime | None = None,
) -> Silence:
    """Store a silence (checked first: nothing is stored when anything is wrong)."""
    now = now or utcnow()
    given = check_matchers(matchers)
    starts = starts_at or now
    check_window(starts, ends_at, now)
    row = Silence(
        matchers=given,
        starts_at=starts,
        ends_at=ends_at,
        created_by=created_by[:128],
        comment=comment,
        created_at=now,
    )
    session.add(row)
    session.flush()
    _audit(session, row, created_by, "silence_created", now)
    return row


def expire_silence(
    *, session: Session, silence_id: int, actor: str, now: datetime | None = None
) -> Silence:
    """End the silence now; ``NotFound``, or ``Conflict`` if it has ended already."""
    now = now or utcnow()
    row = get_silence(session=session, silence_id=silence_id)
    if row is None:
        raise NotFound(f"silence {silence_id} not found")
    if row.state(now) == "expired":
        raise Conflict(f"silence {silence_id} expired at {row.ends_at.isoformat()} already")
    row.ends_at = max(now, row.starts_at)
    row.expired_by = actor[:128]
    session.flush()
    _audit(session, row, actor, "silence_expired", now)
    return row


def _audit(session: Session, row: Silence, actor: str, event: str, now: datetime) -> None:
    job = row.matchers.get("job")
    job_id = None
    if isinstance(job, str) and not GLOB_CHARS & set(job):
        job_id = session.scalar(select(Job.id).where(Job.name == job))
    detail = {
        "silence_id": row.id,
        "matchers": row.matchers,
        "starts_at": row.starts_at.isoformat(),
        "ends_at": row.ends_at.isoformat(),
        "comment": row.comment,
    }
    audit(session=session, job_id=job_id, actor=actor, event=event, detail=detail, at=now)


def get_silence(*, session: Session, silence_id: int) -> Silence | None:
    return session.get(Silence, silence_id)


def list_silences(
    *, session: Session, state: str | None = None, now: datetime | None = None, limit: int = 200
) -> list[Silence]:
    """Silences, newest first; ``state`` picks ``pending``, ``active`` or ``expired``."""
    now = now or utcnow()
    query = select(Silence)
    if state == "expired":
        query = query.where(Silence.ends_at <= now)
    elif state == "active":
        query = query.where(Silence.starts_at <= now, Silence.ends_at > now)
    elif state == "pending":
        query = query.where(Silence.starts_at > now, Silence.ends_at > now)
    elif state is not None:
        raise Invalid(f"state: one of {', '.join(SILENCE_STATES)}")
    return list(session.scalars(query.order_by(Silence.id.desc()).limit(limit)))


def active_silences(*, session: Session, now: datetime) -> list[Silence]:
    """The silences in force at ``now``."""
    query = select(Silence).where(Silence.starts_at <= now, Silence.ends_at > now)
    return list(session.scalars(query.order_by(Silence.id)))


def matches(matchers: dict[str, Any], incident: Incident, job: str) -> bool:
    """Whether every matcher given matches the incident (of the job named ``job``)."""
    pattern = matchers.get("job")
    if pattern is not None and not fnmatchcase(job, pattern):
        return False
    if "kind" in matchers and incident.kind != matchers["kind"]:
        return False
    if "severity" in matchers and incident.severity != matchers["severity"]:
        return False
    return "rank" not in matchers or matchers["rank"] in (incident.ranks or [])


def silencing(silences: Iterable[Silence], incident: Incident, job: str) -> list[Silence]:
    """Of ``silences`` (already known active), the ones that mute this incident."""
    return [s for s in silences if matches(s.matchers, incident, job)]
