"""``vigil import flight-recorder DIR --job NAME``: diagnose PyTorch Flight Recorder dumps
and store the result as a ``hang`` incident of the job.

Dumps are read with a data-only unpickler (``detectors.flight_recorder``): a crafted
pickle is refused, never executed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from backend.db import insert_for, utcnow
from backend.incidents.models import Incident
from backend.incidents.service import apply_findings
from backend.jobs.models import Job
from detectors import flight_recorder


@dataclass
class ImportResult:
    report: str
    incident_id: int | None
    culprits: tuple[int, ...]


def import_dumps(*, session: Session, directory: Path, job: str) -> ImportResult:
    dumps = flight_recorder.load_dumps(directory)
    diagnosis = flight_recorder.diagnose(dumps)
    findings = flight_recorder.analyze(dumps)
    job_id = _ensure_job(session=session, name=job, world_size=len(diagnosis.ranks))
    changes = apply_findings(session=session, job_id=job_id, findings=findings, covered_kinds=())
    incident = (changes.opened + changes.updated)[0] if changes.opened or changes.updated else None
    if incident is None and findings:  # imported before: point at the stored incident
        incident = session.scalar(
            select(Incident)
            .where(Incident.job_id == job_id, Incident.kind == "hang")
            .order_by(Incident.id.desc())
            .limit(1)
        )
    return ImportResult(
        report=flight_recorder.render(diagnosis),
        incident_id=incident.id if incident is not None else None,
        culprits=diagnosis.culprits,
    )


def _ensure_job(*, session: Session, name: str, world_size: int) -> int:
    session.execute(
        insert_for(session, Job)
        .values(
            name=name,
            kind="training",
            world_size=max(1, world_size),
            attempt=0,
            created_at=utcnow(),
        )
        .on_conflict_do_nothing(index_elements=["name"])
    )
    return int(session.scalar(select(Job.id).where(Job.name == name)))  # type: ignore[arg-type]
