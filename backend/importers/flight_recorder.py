"""``vigil import flight-recorder DIR --job NAME``: diagnose PyTorch Flight Recorder dumps
and store the result as a ``hang`` incident of the job.

This is where dump files are read (``detectors`` is pure): ``load_dumps`` reads a directory,
one file per rank named ``*_<rank>``, and hands each file's bytes to
``detectors.flight_recorder.parse_dump``, whose data-only unpickler refuses a crafted pickle
instead of executing it. Errors are ``FlightRecorderError``/``UnsafeDumpError`` naming the file.

Over REST (``POST /api/v1/jobs/{job}/imports/flight-recorder``) the client decodes the files
(``upload_body``: the same unpickler, the same checks) and sends the fields the diagnosis reads
as JSON; the server reads them with ``read_dump`` and never unpickles anything.

    body = upload_body("dumps/")                       # client: {"dumps": [{rank, source, dump}]}
    import_dumps(session=s, dumps=load_dumps("dumps/"), job="moe")   # server, or --local
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from backend.db import insert_for, utcnow
from backend.incidents.models import Incident
from backend.incidents.service import apply_findings
from backend.jobs.models import Job
from detectors import flight_recorder
from detectors.flight_recorder import (
    Dump,
    FlightRecorderError,
    decode_dump,
    parse_dump,
    read_dump,
)

_RANK_IN_NAME = re.compile(r"_(\d+)(?:\.(?:pkl|pickle|json))?$")
# What ``read_dump`` reads of a dump and of each entry; the rest (stack frames, thread ids,
# output sizes, ...) is not sent to the server.
DUMP_FIELDS = ("version", "rank", "pg_config", "pg_status")
ENTRY_FIELDS = (
    "record_id",
    "process_group",
    "pg_id",
    "collective_seq_id",
    "p2p_seq_id",
    "profiling_name",
    "is_p2p",
    "state",
    "retired",
    "time_created_ns",
    "input_sizes",
    "input_dtypes",
    "timeout_ms",
)


def _rank_in_name(p: Path) -> int | None:
    m = _RANK_IN_NAME.search(p.name)
    return int(m.group(1)) if m else None


def _read(p: Path) -> bytes:
    try:
        return p.read_bytes()
    except OSError as exc:
        raise FlightRecorderError(f"{p}: cannot read ({exc.strerror or exc})") from exc


def load_dump(path: str | Path, rank: int | None = None) -> Dump:
    """Read one dump; the rank comes from ``rank``, the dump, or a name ending ``_<rank>``."""
    p = Path(path)
    return parse_dump(_read(p), rank=_rank_in_name(p) if rank is None else rank, source=str(p))


def dump_files(directory: str | Path) -> list[Path]:
    """The files in ``directory`` named ``*_<rank>`` (``.pkl``/``.json`` allowed)."""
    d = Path(directory)
    if not d.is_dir():
        raise FlightRecorderError(f"{d}: not a directory")
    files = sorted(p for p in d.iterdir() if p.is_file() and _RANK_IN_NAME.search(p.name))
    if not files:
        raise FlightRecorderError(f"{d}: no Flight Recorder dumps (files named *_<rank>)")
    return files


def repeated_rank(dumps: Sequence[Dump]) -> tuple[int, str] | None:
    """``(index, message)`` of the first dump whose rank an earlier one has; else ``None``."""
    seen: dict[int, str] = {}
    for i, dump in enumerate(dumps):
        if dump.rank in seen:
            return i, f"{dump.source}: rank {dump.rank} again (also in {seen[dump.rank]})"
        seen[dump.rank] = dump.source
    return None


def load_dumps(directory: str | Path) -> list[Dump]:
    """Every file in ``directory`` named ``*_<rank>`` (``.pkl``/``.json`` allowed), by rank."""
    dumps = [load_dump(p) for p in dump_files(directory)]
    if (repeated := repeated_rank(dumps)) is not None:
        raise FlightRecorderError(repeated[1])
    return sorted(dumps, key=lambda x: x.rank)


def upload_body(directory: str | Path) -> dict[str, Any]:
    """The body of ``POST /api/v1/jobs/{job}/imports/flight-recorder`` for ``directory``:
    each file decoded here (data-only unpickler) and checked as the server will check it
    (errors name the file), cut to the fields the diagnosis reads."""
    items, dumps = [], []
    for p in dump_files(directory):
        raw = decode_dump(_read(p), source=str(p))
        dumps.append(read_dump(raw, rank=_rank_in_name(p), source=str(p)))
        dump = {key: raw[key] for key in DUMP_FIELDS if key in raw}
        dump["entries"] = [{k: e[k] for k in ENTRY_FIELDS if k in e} for e in raw["entries"]]
        items.append({"rank": dumps[-1].rank, "source": p.name, "dump": dump})
    if (repeated := repeated_rank(dumps)) is not None:
        raise FlightRecorderError(repeated[1])
    return {"dumps": sorted(items, key=lambda item: int(item["rank"]))}


@dataclass
class ImportResult:
    report: str
    incident_id: int | None
    culprits: tuple[int, ...]
    ranks: int
    job_id: int


def import_dumps(*, session: Session, dumps: Sequence[Dump], job: str) -> ImportResult:
    """Diagnose one dump per rank; a hang is stored as (or matched to) the job's incident."""
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
        ranks=len(diagnosis.ranks),
        job_id=job_id,
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
