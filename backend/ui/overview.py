"""Read models of the dashboard pages: the jobs at a glance, alerts across jobs, an
incident with its evidence and actions.

    jobs_overview(session=s)        # [{"name", "last_step", "open": {"critical": 1, …}, …}]
    serving_health(session=s, rows=rows, now=time.time())   # adds "slo" to serving jobs
    alerts(session=s)               # (open incidents, recently resolved)

Chart data comes from ``backend.telemetry`` (queries and JSON routes).
"""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from backend.actions.models import Action
from backend.incidents.models import SEVERITIES, Incident
from backend.jobs import service as jobs
from backend.jobs.models import Job, Run
from backend.telemetry.serving_status import slo_headline, slo_statuses

log = logging.getLogger(__name__)

OPEN_LIMIT = 1000  # open incidents listed on the alerts page
SLO_JOBS_LIMIT = 200  # serving jobs whose SLO health the jobs list computes
HEALTH = {"ok": 1, "info": 2, "warning": 3, "critical": 4}  # a row's "worst", in order


def jobs_overview(*, session: Session) -> list[dict[str, Any]]:
    """Every job with its open incidents by severity and its current run's median recent
    step time."""
    rows = jobs.list_jobs(session=session)
    current = select(Job.name, Job.id, Run).outerjoin(Run, Run.id == Job.run_id)
    ids = {name: (job_id, run) for name, job_id, run in session.execute(current)}
    counts: dict[int, dict[str, int]] = {}
    query = (
        select(Incident.job_id, Incident.severity, func.count())
        .where(Incident.status == "open")
        .group_by(Incident.job_id, Incident.severity)
    )
    for job_id, severity, n in session.execute(query):
        counts.setdefault(job_id, {})[severity] = n
    for row in rows:
        job_id, run = ids[row["name"]]
        row["open"] = {s: counts.get(job_id, {}).get(s, 0) for s in SEVERITIES}
        row["open_total"] = sum(row["open"].values())
        row["worst"] = next(
            (s for s in reversed(SEVERITIES) if row["open"][s]), "ok" if row["last_step"] else ""
        )
        row["step_time_median_s"] = jobs.step_time_s(
            session=session, job_id=job_id, run=run, last_step=row["last_step"]
        )
    return rows


def serving_health(*, session: Session, rows: list[dict[str, Any]], now: float) -> None:
    """Adds ``slo`` to each serving job's row: the headline of its SLOs (``level``,
    ``short``, ``text``, ``worst`` attainment vs objective), and raises the row's health
    (``worst``) to a violated (critical) or at-risk (warning) SLO's. Never raises: a job
    whose SLOs cannot be read shows "status unavailable"; past ``SLO_JOBS_LIMIT``, nothing."""
    serving = [row for row in rows if row.get("kind") == "serving"][:SLO_JOBS_LIMIT]
    for row in serving:
        try:
            row["slo"] = slo_headline(slo_statuses(session=session, job=row["name"], now=now))
        except Exception:  # the jobs list must render whatever one job's SLOs do
            log.warning("SLO health of job %r failed", row["name"], exc_info=True)
            row["slo"] = {
                "level": "unknown",
                "short": "status unavailable",
                "text": "SLO status unavailable.",
                "worst": None,
            }
        level = row["slo"]["level"]
        if level in HEALTH and HEALTH[level] > HEALTH.get(row.get("worst") or "", 0):
            row["worst"] = level


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


def incident_actions(*, session: Session, incident_id: int) -> list[Action]:
    query = select(Action).where(Action.incident_id == incident_id).order_by(Action.id.desc())
    return list(session.scalars(query))
