"""Incidents from findings: open, update while they last, resolve when they clear.

A finding's ``key`` (e.g. ``straggler:6``) identifies the problem within a job; the
incident's fingerprint is ``<job id>:<key>``. Applying the findings of one detection run:

- an active finding updates the open incident with its fingerprint, or opens one;
- an inactive finding (a transient episode that is already over) resolves the open
  incident, or records a resolved one if this episode was never seen open;
- an open incident of a kind the run covered, whose finding is gone, is resolved.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from backend.db import utcnow
from backend.incidents.models import Incident
from detectors.finding import Finding


@dataclass
class Changes:
    opened: list[Incident] = field(default_factory=list)
    updated: list[Incident] = field(default_factory=list)
    resolved: list[Incident] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.opened or self.updated or self.resolved)


def fingerprint(job_id: int, key: str) -> str:
    return f"{job_id}:{key}"


def apply_findings(
    *, session: Session, job_id: int, findings: Iterable[Finding], covered_kinds: Iterable[str]
) -> Changes:
    changes = Changes()
    now = utcnow()
    covered = set(covered_kinds)
    open_rows = {
        row.fingerprint: row
        for row in session.scalars(
            select(Incident).where(Incident.job_id == job_id, Incident.status == "open")
        )
    }
    seen: set[str] = set()
    for f in findings:
        fp = fingerprint(job_id, f.key)
        seen.add(fp)
        row = open_rows.get(fp)
        if row is None and not f.active and _episode_known(session, fp, f):
            continue  # this finished episode is already on record
        if row is None:
            row = Incident(
                job_id=job_id, kind=f.kind, fingerprint=fp, status="open", detected_at=now
            )
            session.add(row)
            changes.opened.append(row)
        elif _differs(row, f):
            changes.updated.append(row)
        _copy(row, f, now)
        if not f.active:
            row.status, row.resolved_at = "resolved", now
            if row not in changes.opened:
                changes.resolved.append(row)
    for fp, row in open_rows.items():
        if fp not in seen and row.kind in covered:
            row.status, row.resolved_at, row.updated_at = "resolved", now, now
            row.evidence = {**row.evidence, "resolved_because": "condition no longer detected"}
            changes.resolved.append(row)
    session.flush()
    return changes


def _episode_known(session: Session, fp: str, f: Finding) -> bool:
    """Whether an incident with this fingerprint already covers the finding's episode.

    Sliding windows re-date an episode (its first step moves as the window moves), so
    episodes match when their step ranges overlap, not on equal first steps.
    """
    if f.first_step is None:
        return (
            session.scalar(select(Incident.id).where(Incident.fingerprint == fp).limit(1))
            is not None
        )
    last = f.last_step if f.last_step is not None else f.first_step
    rows = session.execute(
        select(Incident.first_step, Incident.evidence).where(Incident.fingerprint == fp)
    ).all()
    for first_step, evidence in rows:
        if first_step is None:
            return True
        ended = (evidence or {}).get("last_step", first_step)
        if first_step <= last and f.first_step <= ended:
            return True
    return False


def _differs(row: Incident, f: Finding) -> bool:
    return (row.severity, list(row.ranks or []), row.summary) != (
        f.severity,
        list(f.ranks),
        f.summary,
    )


def _copy(row: Incident, f: Finding, now: Any) -> None:
    row.severity = f.severity
    row.ranks = list(f.ranks)
    if row.first_step is None or (f.first_step is not None and f.first_step < row.first_step):
        row.first_step = f.first_step
    row.score = float(f.score)
    row.summary = f.summary
    row.evidence = {**f.evidence, **({"last_step": f.last_step} if f.last_step is not None else {})}
    row.updated_at = now


def list_incidents(
    *, session: Session, job_id: int, status: str | None = None, limit: int = 200
) -> list[Incident]:
    query = select(Incident).where(Incident.job_id == job_id)
    if status is not None:
        query = query.where(Incident.status == status)
    return list(session.scalars(query.order_by(Incident.id.desc()).limit(limit)))


def get_incident(*, session: Session, incident_id: int) -> Incident | None:
    return session.get(Incident, incident_id)
