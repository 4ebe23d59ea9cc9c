"""Retention: jobs silent for longer than ``VIGIL_RETENTION_DAYS`` are deleted whole.

Whole jobs, not old rows: a detector or a goodput report over half a job would mislead.
Tables with a foreign key to the job go by cascade; the two append-only telemetry tables
without one (steps, collectives) are deleted explicitly. Delivery logs older than the
retention go too.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from backend.alerts.models import WebhookDelivery
from backend.celery_app import redis_lock, runtime, vigil_task
from backend.db import session_scope, utcnow
from backend.jobs.models import Job, Rank
from backend.telemetry.models import CollectiveRecord, StepRecord

log = logging.getLogger(__name__)


def purge_old_jobs(*, session: Session, older_than_days: float) -> list[str]:
    """Delete jobs whose ranks were all last seen before the cutoff; returns their names."""
    cutoff = utcnow() - timedelta(days=older_than_days)
    last_seen = (
        select(Rank.job_id, func.max(Rank.last_seen_at).label("seen"))
        .group_by(Rank.job_id)
        .subquery()
    )
    stale = session.execute(
        select(Job.id, Job.name)
        .outerjoin(last_seen, last_seen.c.job_id == Job.id)
        .where(func.coalesce(last_seen.c.seen, Job.created_at) < cutoff)
    ).all()
    ids = [row.id for row in stale]
    if ids:
        session.execute(delete(StepRecord).where(StepRecord.job_id.in_(ids)))
        session.execute(delete(CollectiveRecord).where(CollectiveRecord.job_id.in_(ids)))
        session.execute(delete(Job).where(Job.id.in_(ids)))
    session.execute(delete(WebhookDelivery).where(WebhookDelivery.created_at < cutoff))
    session.flush()
    return [row.name for row in stale]


@vigil_task("retention", time_limit_s=1800)
def retention() -> None:
    rt = runtime()
    if rt.settings.retention_days <= 0:
        return
    with redis_lock("retention", ttl_s=1800) as got:
        if not got:
            return
        with session_scope(rt.factory, write=True) as session:
            names = purge_old_jobs(session=session, older_than_days=rt.settings.retention_days)
        if names:
            log.info("retention: deleted %d job(s): %s", len(names), ", ".join(names[:20]))
