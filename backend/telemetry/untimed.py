"""Ranks whose collectives Vigil cannot time, from the collector's ``collectives_untimed``
events (``collector.integrations.torch_distributed``: a DDP model wrapped before
``vigil.init()`` with a hook Vigil cannot replace). The job page warns about them: without
those timings the straggler detector cannot tell which rank waits least.

    untimed_collectives(session=s, job_id=7)
    # {"ranks": [0, 1], "reasons": ["a communication hook was registered before vigil.init()"]}
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from backend.telemetry.models import JobEvent

UNTIMED_EVENT = "collectives_untimed"
MAX_ROWS = 10_000  # one event per rank and process: bounded by the job's ranks
MAX_REASONS = 5


def untimed_collectives(*, session: Session, job_id: int) -> dict[str, Any] | None:
    """The ranks that reported untimed collectives and why, or None when none did."""
    rows = session.execute(
        select(JobEvent.rank, JobEvent.attrs)
        .where(JobEvent.job_id == job_id, JobEvent.name == UNTIMED_EVENT)
        .order_by(JobEvent.id.desc())
        .limit(MAX_ROWS)
    ).all()
    if not rows:
        return None
    reasons: dict[str, None] = {}
    for _, attrs in rows:
        why = attrs.get("reason") if isinstance(attrs, dict) else None
        if why:
            reasons.setdefault(str(why)[:300], None)
    return {"ranks": sorted({int(r) for r, _ in rows}), "reasons": list(reasons)[:MAX_REASONS]}
