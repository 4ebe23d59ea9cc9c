"""``vigil import flight-recorder DIR --job NAME``: diagnose PyTorch Flight Recorder dumps
and store the result as a ``hang`` incident of the job.

This is where dump files are read (``detectors`` is pure): ``load_dumps`` reads a directory,
one file per rank named ``*_<rank>``, and hands each file's bytes to
``detectors.flight_recorder.parse_dump``, whose data-only unpickler refuses a crafted pickle
instead of executing it. Errors are ``FlightRecorderError``/``UnsafeDumpError`` naming the file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from backend.db import insert_for, utcnow
from backend.incidents.models import Incident
from backend.incidents.service import apply_findings
from backend.jobs.models import Job
from detectors import flight_recorder
from detectors.flight_recorder import Dump, FlightRecorderError, parse_dump

_RANK_IN_NAME = re.compile(r"_(\d+)(?:\.(?:pkl|pickle|json))?$")


def load_dump(path: str | Path, rank: int | None = None) -> Dump:
    """Read one dump; the rank comes from ``rank``, the dump, or a name ending ``_<rank>``."""
    p = Path(path)
    if rank is None and (m := _RANK_IN_NAME.search(p.name)):
        rank = int(m.group(1))
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise FlightRecorderError(f"{p}: cannot read ({exc.strerror or exc})") from exc
    return parse_dump(data, rank=rank, source=str(p))


def load_dumps(directory: str | Path) -> list[Dump]:
    """Every file in ``directory`` named ``*_<rank>`` (``.pkl``/``.json`` allowed), by rank."""
    d = Path(directory)
    if not d.is_dir():
        raise FlightRecorderError(f"{d}: not a directory")
    files = sorted(p for p in d.iterdir() if p.is_file() and _RANK_IN_NAME.search(p.name))
    if not files:
        raise FlightRecorderError(f"{d}: no Flight Recorder dumps (files named *_<rank>)")
    dumps = [load_dump(p) for p in files]
    seen: dict[int, str] = {}
    for dump in dumps:
        if dump.rank in seen:
            raise FlightRecorderError(
                f"{dump.source}: rank {dump.rank} again (also in {seen[dump.rank]})"
            )
        seen[dump.rank] = dump.source
    return sorted(dumps, key=lambda x: x.rank)


@dataclass
class ImportResult:
    report: str
    incident_id: int | None
    culprits: tuple[int, ...]


def import_dumps(*, session: Session, directory: Path, job: str) -> ImportResult:
    dumps = load_dumps(directory)
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
