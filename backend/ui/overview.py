"""Read models of the dashboard pages: the jobs at a glance, alerts across jobs, an
incident with its evidence and actions.

    jobs_overview(session=s)        # [{"name", "last_step", "open": {"critical": 1, …}, …}]
    evidence_chart(session=s, incident=row)   # named ranks' compute time vs the median
"""

from __future__ import annotations

import json
import statistics
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from backend.actions.models import Action
from backend.incidents.models import SEVERITIES, Incident
from backend.jobs import service as jobs
from backend.jobs.models import Job
from backend.telemetry.models import StepRecord
from backend.ui.data import Extent, compute_time, num

RECENT_STEPS = 200
EVIDENCE_ROWS = 100_000  # rows the evidence chart may read around the first step
EVIDENCE_RANKS = 8  # named ranks drawn
OPEN_LIMIT = 1000  # open incidents listed on the alerts page


def jobs_overview(*, session: Session) -> list[dict[str, Any]]:
    """Every job with its open incidents by severity and median recent step time."""
    rows = jobs.list_jobs(session=session)
    ids = dict(session.execute(select(Job.name, Job.id)).all())
    counts: dict[int, dict[str, int]] = {}
    query = (
        select(Incident.job_id, Incident.severity, func.count())
        .where(Incident.status == "open")
        .group_by(Incident.job_id, Incident.severity)
    )
    for job_id, severity, n in session.execute(query):
        counts.setdefault(job_id, {})[severity] = n
    for row in rows:
        job_id = ids[row["name"]]
        row["open"] = {s: counts.get(job_id, {}).get(s, 0) for s in SEVERITIES}
        row["open_total"] = sum(row["open"].values())
        row["worst"] = next(
            (s for s in reversed(SEVERITIES) if row["open"][s]), "ok" if row["last_step"] else ""
        )
        recent = session.scalars(
            select(StepRecord.duration_s)
            .where(StepRecord.job_id == job_id)
            .order_by(StepRecord.step.desc())
            .limit(RECENT_STEPS)
        ).all()
        row["step_time_median_s"] = statistics.median(recent) if recent else None
    return rows


def alerts(*, session: Session, recent: int = 100) -> tuple[list[Any], list[Any]]:
    """Open incidents (worst first, then newest) and the most recently resolved, each a
    ``(Incident, job name)`` row."""
    base = select(Incident, Job.name).join(Job, Job.id == Incident.job_id)
    rank = {s: i for i, s in enumerate(SEVERITIES)}
    opened = list(
        session.execute(
            base.where(Incident.status == "open").order_by(Incident.id.desc()).limit(OPEN_LIMIT)
        ).all()
    )
    opened.sort(key=lambda r: (-rank.get(r[0].severity, 0), -r[0].detected_at.timestamp()))
    resolved = session.execute(
        base.where(Incident.status == "resolved")
        .order_by(Incident.resolved_at.desc().nulls_last(), Incident.id.desc())
        .limit(recent)
    ).all()
    return opened, list(resolved)


def evidence_rows(evidence: dict[str, Any], prefix: str = "") -> list[tuple[str, str]]:
    """A detector's evidence flattened to ``(key, text)`` pairs for a table; nested dicts
    become dotted keys, numbers are shortened, lists and the rest shown as JSON."""
    out: list[tuple[str, str]] = []
    for key, value in evidence.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.extend(evidence_rows(value, prefix=f"{name}."))
        elif isinstance(value, float):
            out.append((name, f"{value:.6g}"))
        elif isinstance(value, str):
            out.append((name, value))
        else:
            out.append((name, json.dumps(value, default=str)))
    return out


def incident_actions(*, session: Session, incident_id: int) -> list[Action]:
    query = select(Action).where(Action.incident_id == incident_id).order_by(Action.id.desc())
    return list(session.scalars(query))


def evidence_chart(*, session: Session, incident: Incident) -> dict[str, Any]:
    """Compute time per step around the incident's first step: the median over all ranks
    and each named rank (at most ``EVIDENCE_RANKS``). Reads at most ``EVIDENCE_ROWS`` rows."""
    ext = Extent.of(session, incident.job_id)
    named = [int(r) for r in (incident.ranks or [])][:EVIDENCE_RANKS]
    out: dict[str, Any] = {"step": [], "median": [], "ranks": [], "first_step": None}
    if ext is None:
        return out
    center = ext.last_step if incident.first_step is None else int(incident.first_step)
    half = max(5, min(100, EVIDENCE_ROWS // (2 * ext.ranks)))
    lo, hi = max(ext.first_step, center - half), min(ext.last_step, center + half)
    rows = session.execute(
        select(StepRecord.step, StepRecord.rank, compute_time()).where(
            StepRecord.job_id == incident.job_id,
            StepRecord.step >= lo,
            StepRecord.step <= hi,
        )
    ).all()
    by_step: dict[int, list[float]] = {}
    by_rank: dict[int, dict[int, float]] = {r: {} for r in named}
    for step, rank, value in rows:
        by_step.setdefault(int(step), []).append(float(value))
        if rank in by_rank:
            by_rank[rank][int(step)] = float(value)
    steps = sorted(by_step)
    out["step"] = steps
    out["median"] = [num(statistics.median(by_step[s])) for s in steps]
    out["ranks"] = [
        {"rank": r, "compute_s": [num(by_rank[r].get(s)) for s in steps]} for r in named
    ]
    out["first_step"] = incident.first_step
    return out
