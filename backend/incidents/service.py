"""Incidents from findings: open, update while they last, resolve when they clear.

A finding's ``key`` (e.g. ``straggler:6``) identifies the problem within a job; the
incident's fingerprint is ``<job id>:<key>``. Applying the findings of one detection run:

- an active finding updates the open incident with its fingerprint, or opens one;
- an inactive finding (a transient episode that is already over) resolves the open
  incident, or records a resolved one if this episode was never seen open;
- an open incident of a kind the run covered, whose finding is gone, is resolved;
- an active finding whose episode a *resolved* incident with its fingerprint already
  covers (the same onset, seen again after the incident was resolved: a sliding window
  re-dated it, or the condition flapped) re-opens that incident: same id, evidence
  ``reopened`` counts how often; it is in ``Changes.reopened``, not ``opened``;
- an incident a person resolved (``backend.incidents.handling``) is never re-opened; the
  rest of its episode is ignored (``backend.incidents.holds``), a new episode opens a new
  incident;
- a job-wide ``slowdown`` that an open straggler, hang or slow link (``comm_anomaly`` naming
  ranks) explains — its onset within ``LINK_SLACK_STEPS`` steps of theirs — is linked to
  it as a consequence: evidence ``consequence_of`` holds the cause's id and the summary says
  so. A slowdown linked as it opens is in ``Changes.linked``, not ``opened``: one fault,
  one notification, one proposed action (``backend.incidents.follow_up``). One linked
  after it opened is in ``Changes.linked`` too; its open actions are withdrawn.
- an incident a restarting action (restart, rollback, evict) was taken on keeps the
  diagnosis it was taken on: while the ranks are torn down and started again a detector
  sees exits and half-reported states (a rank killed by the restart looks like a hang's
  culprit), so later findings may resolve it but no longer rename its ranks or summary.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from backend.actions.models import Action
from backend.actions.service import RESTARTING_KINDS
from backend.db import utcnow
from backend.incidents.holds import Holds
from backend.incidents.models import Incident
from backend.jobs.runs import current_run_number
from detectors.finding import Finding

# Incident kinds whose named ranks explain a job-wide slowdown (everyone waits for them).
CAUSES = ("straggler", "hang", "comm_anomaly")
LINK_SLACK_STEPS = 50
# Evidence keys the backend owns: kept when a detector's new evidence replaces the rest.
_KEPT = ("reopened", "consequence_of")


@dataclass
class Changes:
    opened: list[Incident] = field(default_factory=list)
    updated: list[Incident] = field(default_factory=list)
    resolved: list[Incident] = field(default_factory=list)
    reopened: list[Incident] = field(default_factory=list)
    linked: list[Incident] = field(default_factory=list)  # newly linked consequences

    def __bool__(self) -> bool:
        return bool(self.opened or self.updated or self.resolved or self.reopened or self.linked)


def fingerprint(job_id: int, key: str, run: int = 1) -> str:
    """``<job id>:<key>``, and ``<job id>@<run>:<key>`` from the job's second run on
    (``backend.jobs.runs``): an episode of one run never continues one of another."""
    return f"{job_id if run <= 1 else f'{job_id}@{run}'}:{key}"


def run_of(fingerprint_: str) -> int:
    """The number of the run an incident belongs to, from its :func:`fingerprint`."""
    head = fingerprint_.partition(":")[0]
    number = head.partition("@")[2]
    return int(number) if number.isdigit() else 1


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
    acted_on = _acted_on(session, [row.id for row in open_rows.values()])
    holds = Holds(session, job_id)
    run = current_run_number(session=session, job_id=job_id)
    this_run = fingerprint(job_id, "", run)  # an ended run's incidents are its own to end
    for f in findings:
        fp = fingerprint(job_id, f.key, run)
        seen.add(fp)
        row = open_rows.get(fp)
        if row is None and not f.active and _episode_known(session, fp, f):
            continue  # this finished episode is already on record
        if row is None and holds.covers(fp, f):
            continue  # resolved by hand: the rest of this episode stays resolved
        if row is None and f.active:
            row = _resolved_episode(session, fp, f)
            if row is not None:  # the same episode again: the same incident
                row.status, row.resolved_at = "open", None
                row.evidence = {**row.evidence, "reopened": row.evidence.get("reopened", 0) + 1}
                row.evidence.pop("resolved_because", None)
                changes.reopened.append(row)
                open_rows[fp] = row
        if row is None:
            row = Incident(
                job_id=job_id, kind=f.kind, fingerprint=fp, status="open", detected_at=now
            )
            session.add(row)
            changes.opened.append(row)
        elif row.id in acted_on or (f.evidence or {}).get("partial_view"):
            # Acted on, or the finding sees only part of the episode (the window slid past
            # a NaN's onset; ranks of a hung job are leaving): keep the diagnosis made.
            f = _frozen(row, f)
        elif _differs(row, f):
            changes.updated.append(row)
        _copy(row, f, now)
        if not f.active:
            row.status, row.resolved_at = "resolved", now
            if row not in changes.opened:
                changes.resolved.append(row)
    for fp, row in open_rows.items():
        if fp not in seen and row.kind in covered and fp.startswith(this_run):
            row.status, row.resolved_at, row.updated_at = "resolved", now, now
            row.evidence = {**row.evidence, "resolved_because": "condition no longer detected"}
            changes.resolved.append(row)
    holds.release(covered)
    session.flush()
    _link_consequences(session, job_id, changes)
    return changes


def _acted_on(session: Session, incident_ids: list[int]) -> set[int]:
    """The incidents among these that a restarting action is under way or done for."""
    if not incident_ids:
        return set()
    return set(
        session.scalars(
            select(Action.incident_id).where(
                Action.incident_id.in_(incident_ids),
                Action.kind.in_(RESTARTING_KINDS),
                Action.state.in_(("pending", "dispatched", "acked", "succeeded")),
            )
        )
    )


def _frozen(row: Incident, f: Finding) -> Finding:
    """``f`` carrying the incident's diagnosis (ranks, severity, summary, evidence) and only
    its own activity: whether the condition still holds, and until which step."""
    return replace(
        f,
        ranks=tuple(row.ranks or ()),
        severity=row.severity,  # type: ignore[arg-type]
        summary=row.summary,
        first_step=row.first_step,
        evidence={k: v for k, v in (row.evidence or {}).items() if k != "last_step"},
    )


def _resolved_episode(session: Session, fp: str, f: Finding) -> Incident | None:
    """The latest resolved incident with this fingerprint whose episode the active finding
    continues: it began at or before the point where that incident was last known."""
    if f.first_step is None:
        return None
    rows = session.scalars(
        select(Incident)
        .where(
            Incident.fingerprint == fp,
            Incident.status == "resolved",
            Incident.resolved_by.is_(None),  # one a person resolved is never re-opened
        )
        .order_by(Incident.id.desc())
        .limit(5)
    )
    for row in rows:
        if row.first_step is None:
            continue
        known_to = max(row.first_step, int((row.evidence or {}).get("last_step", row.first_step)))
        if f.first_step <= known_to:
            return row
    return None


def _link_consequences(session: Session, job_id: int, changes: Changes) -> None:
    """Link each open, unlinked slowdown of the job to an open cause that explains it."""
    rows = list(
        session.scalars(
            select(Incident)
            .where(Incident.job_id == job_id, Incident.status == "open")
            .order_by(Incident.id)
        )
    )
    causes = [r for r in rows if r.kind in CAUSES and r.ranks]
    for row in rows:
        if row.kind != "slowdown":
            continue
        cause_id = (row.evidence or {}).get("consequence_of")
        cause = next((c for c in causes if c.id == cause_id), None)
        if cause is None:
            cause = next((c for c in causes if _explains(c, row)), None)
            if cause is None:
                continue
            row.evidence = {**row.evidence, "consequence_of": cause.id}
            if row in changes.opened:
                changes.opened.remove(row)
            changes.linked.append(row)
        note = f" (a consequence of incident #{cause.id}: {_name(cause)})"
        if not row.summary.endswith(note):
            row.summary += note
    session.flush()


def _explains(cause: Incident, slowdown: Incident) -> bool:
    if cause.first_step is None or slowdown.first_step is None:
        return cause.kind == "hang"
    return abs(slowdown.first_step - cause.first_step) <= LINK_SLACK_STEPS


def _name(cause: Incident) -> str:
    ranks = ", ".join(str(r) for r in (cause.ranks or [])[:8])
    more = "…" if len(cause.ranks or []) > 8 else ""
    label = {"comm_anomaly": "slow link"}.get(cause.kind, cause.kind)
    return f"{label}, rank{'s' if len(cause.ranks or []) > 1 else ''} {ranks}{more}"


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
    summary = row.summary.split(" (a consequence of incident #")[0]
    return (row.severity, list(row.ranks or []), summary) != (
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
    kept = {k: row.evidence[k] for k in _KEPT if k in (row.evidence or {})}
    row.evidence = {
        **f.evidence,
        **({"last_step": f.last_step} if f.last_step is not None else {}),
        **kept,
    }
    row.updated_at = now


def list_incidents(
    *,
    session: Session,
    job_id: int,
    status: str | None = None,
    limit: int = 200,
    run: int | None = None,
) -> list[Incident]:
    """The job's newest incidents; ``run``: only that run's (by :func:`fingerprint`)."""
    query = select(Incident).where(Incident.job_id == job_id)
    if run is not None:
        scope = fingerprint(job_id, "", run)
        query = query.where(Incident.fingerprint.startswith(scope, autoescape=True))
    if status is not None:
        query = query.where(Incident.status == status)
    return list(session.scalars(query.order_by(Incident.id.desc()).limit(limit)))


def get_incident(*, session: Session, incident_id: int) -> Incident | None:
    return session.get(Incident, incident_id)
