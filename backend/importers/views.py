"""``POST /api/v1/jobs/{job}/imports/flight-recorder``: PyTorch Flight Recorder dumps, one per
rank, diagnosed and stored as the job's ``hang`` incident (created with the job if new).

Needs the ``ingest`` scope (or ``admin``): like a collector, it reports what a job did. The
dumps arrive decoded, as JSON (``vigil import`` decodes the pickles on the client with the
data-only unpickler), so the server never unpickles; each is checked by the same
``read_dump`` as a file, and a bad one is a 422 naming ``dumps[i]`` with nothing stored. The
body may be as large as an ingest batch (``VIGIL_MAX_BODY_BYTES``, ``backend.limits``).

``POST /api/v1/jobs/{job}/imports/kineto``: PyTorch profiler (Kineto) traces, read by the
client into per-iteration numbers (``backend.importers.kineto_upload``) and stored as the
job's steps, collectives, op sequences and GPU breakdown, then judged by the detectors
(``backend.importers.kineto_store``).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Request

from backend.audit.service import audit
from backend.auth.deps import require_scope
from backend.auth.service import Principal
from backend.deps import SessionDep
from backend.errors import Invalid, errors
from backend.importers import kineto_store
from backend.importers.flight_recorder import import_dumps, repeated_rank
from backend.importers.kineto_schemas import IncidentBrief, KinetoImport, KinetoImportOut
from backend.importers.schemas import FlightRecorderImport, FlightRecorderImportOut
from detectors.flight_recorder import Dump, FlightRecorderError, read_dump

router = APIRouter(prefix="/api/v1/jobs", tags=["imports"])
IMPORT_PATH = "/{job}/imports/flight-recorder"
JobName = Annotated[str, Path(min_length=1, max_length=200, pattern=r"^[^/\x00-\x1f\x7f]+$")]


def _field_error(field: str, msg: str) -> Invalid:
    return Invalid([{"field": field, "msg": msg, "type": "flight_recorder"}])


def _read(body: FlightRecorderImport) -> list[Dump]:
    dumps = []
    for i, item in enumerate(body.dumps):
        try:
            dumps.append(read_dump(item.dump, rank=item.rank, source=item.source or f"rank {i}"))
        except FlightRecorderError as exc:
            raise _field_error(f"dumps[{i}].dump", str(exc)) from None
    if (repeated := repeated_rank(dumps)) is not None:
        raise _field_error(f"dumps[{repeated[0]}].rank", repeated[1])
    return dumps


@router.post(IMPORT_PATH, response_model=FlightRecorderImportOut)
def import_flight_recorder(
    job: JobName,
    body: FlightRecorderImport,
    session: SessionDep,
    who: Annotated[Principal, Depends(require_scope("ingest"))],
) -> Any:
    """Name the ranks a hung job waits for, from its ranks' Flight Recorder dumps."""
    if not job.strip():
        raise Invalid("job: a name is not blank")
    result = import_dumps(session=session, dumps=_read(body), job=job)
    audit(
        session=session,
        job_id=result.job_id,
        actor=f"api:{who.name}",
        event="imported",
        incident_id=result.incident_id,
        detail={
            "what": "flight_recorder",
            "ranks": result.ranks,
            "culprits": list(result.culprits),
        },
    )
    return FlightRecorderImportOut(
        job=job,
        ranks=result.ranks,
        culprits=list(result.culprits),
        incident_id=result.incident_id,
        report=result.report,
    )


@router.post(
    "/{job}/imports/kineto",
    response_model=KinetoImportOut,
    responses=errors(409, e409="The job is a serving job that is still reporting"),
)
def import_kineto(
    job: JobName,
    body: KinetoImport,
    request: Request,
    session: SessionDep,
    who: Annotated[Principal, Depends(require_scope("ingest"))],
) -> Any:
    """Store a PyTorch profiler trace's iterations (one part per rank) as the job's
    telemetry: steps, collectives, op sequences and the GPU breakdown; then judge them."""
    if not job.strip():
        raise Invalid("job: a name is not blank")
    stored = kineto_store.import_kineto(
        session=session, body=body, job=job, settings=request.app.state.settings
    )
    audit(
        session=session,
        job_id=stored.job_id,
        actor=f"api:{who.name}",
        event="imported",
        detail={"what": "kineto", "ranks": stored.ranks, "iterations": stored.iterations},
    )
    return KinetoImportOut(
        job=job,
        ranks=stored.ranks,
        iterations=stored.iterations,
        duplicates=stored.duplicates,
        incidents=[
            IncidentBrief(id=i.id, kind=i.kind, ranks=list(i.ranks), summary=i.summary)
            for i in stored.incidents
        ],
    )
