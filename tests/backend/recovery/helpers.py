"""Builders for recovery tests: a job with steps and a checkpoint, incidents."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from backend.db import utcnow
from backend.incidents.models import Incident
from backend.jobs.models import Job
from backend.telemetry.models import JobEvent, StepRecord


def make_job(
    session: Session,
    name: str = "llama-8b-pretrain",
    *,
    world_size: int = 8,
    steps: int = 100,
    step_s: float = 1.0,
    checkpoint_at: int | None = 90,
) -> Job:
    """A job whose steps 0..steps-1 took ``step_s`` each, checkpointed at ``checkpoint_at``."""
    job = Job(name=name, world_size=world_size)
    session.add(job)
    session.flush()
    session.add_all(
        StepRecord(job_id=job.id, rank=0, step=s, ts=1000.0 + s * step_s, duration_s=step_s)
        for s in range(steps)
    )
    if checkpoint_at is not None:
        session.add(
            JobEvent(job_id=job.id, rank=0, name="checkpoint_saved", step=checkpoint_at, attrs={})
        )
    session.flush()
    return job


def make_incident(
    session: Session,
    job: Job,
    kind: str = "hang",
    *,
    ranks: tuple[int, ...] = (3,),
    status: str = "open",
    evidence: dict[str, Any] | None = None,
    first_step: int | None = None,
) -> Incident:
    row = Incident(
        job_id=job.id,
        kind=kind,
        severity="critical",
        status=status,
        fingerprint=f"{job.id}:{kind}:{utcnow().timestamp()}",
        ranks=list(ranks),
        first_step=first_step,
        summary=f"a {kind}",
        evidence=evidence or {},
        detected_at=utcnow(),
        updated_at=utcnow(),
    )
    session.add(row)
    session.flush()
    return row
