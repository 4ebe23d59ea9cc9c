"""SLOs over REST: define them (admin), read them with their figures (read).

curl -X POST $VIGIL/api/v1/slos -H "Authorization: Bearer $ADMIN" -d '{"job": "chat",
     "name": "interactive", "ttft_s": 0.5, "tpot_s": 0.05, "objective": 0.99}'
curl $VIGIL/api/v1/jobs/chat/slos -H "Authorization: Bearer $READ"
"""

from __future__ import annotations

import time
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Response

from backend.auth.deps import require_scope
from backend.deps import RowId, SessionDep
from backend.errors import errors
from backend.slos import service
from backend.slos.models import Slo
from backend.slos.schemas import SloIn, SloOut, SloPatch, SloStatus

router = APIRouter(prefix="/api/v1", tags=["slos"])
ADMIN = [Depends(require_scope("admin"))]
READ = [Depends(require_scope("read"))]


def _out(slo: Slo) -> dict[str, Any]:
    return {c.key: getattr(slo, c.key) for c in Slo.__table__.columns}


@router.post(
    "/slos", response_model=SloOut, status_code=201, dependencies=ADMIN, responses=errors(409)
)
def create_slo(body: SloIn, session: SessionDep) -> Any:
    """Define an SLO for a serving job (the job need not have reported yet). Its figures
    are computed from the requests already stored. 409 if the job has one of that name."""
    values = body.model_dump(exclude={"job", "name"})
    return _out(service.create_slo(session=session, job=body.job, name=body.name, **values))


@router.get("/slos", response_model=list[SloOut], dependencies=READ)
def list_slos(session: SessionDep, job: str | None = None) -> Any:
    return [_out(s) for s in service.list_slos(session=session, job=job)]


@router.get("/slos/{slo_id}", response_model=SloOut, dependencies=READ, responses=errors(404))
def get_slo(slo_id: RowId, session: SessionDep) -> Any:
    return _out(service.get_slo(session=session, slo_id=slo_id))


@router.patch(
    "/slos/{slo_id}", response_model=SloOut, dependencies=ADMIN, responses=errors(404, 409)
)
def update_slo(slo_id: RowId, body: SloPatch, session: SessionDep) -> Any:
    """Change an SLO; its figures are recomputed for the new thresholds."""
    slo = service.get_slo(session=session, slo_id=slo_id)
    changes = body.model_dump(exclude_unset=True)
    return _out(service.update_slo(session=session, slo=slo, **changes))


@router.delete("/slos/{slo_id}", status_code=204, dependencies=ADMIN, responses=errors(404))
def delete_slo(slo_id: RowId, session: SessionDep) -> Response:
    service.delete_slo(session=session, slo=service.get_slo(session=session, slo_id=slo_id))
    return Response(status_code=204)


@router.get(
    "/jobs/{job}/slos", response_model=list[SloStatus], dependencies=READ, responses=errors(404)
)
def job_slos(
    job: str,
    session: SessionDep,
    since: Annotated[float | None, Query(ge=0, le=1e10, description="epoch seconds")] = None,
    until: Annotated[float | None, Query(ge=0, le=1e10, description="epoch seconds")] = None,
) -> Any:
    """Each SLO of the job with its attainment (joint and per threshold), goodput,
    smooth goodput, error budget left and burn rates, over ``since..until`` (default: the
    SLO's period up to now)."""
    now = time.time()
    return [
        {**_out(s), **service.status(session=session, slo=s, now=now, since=since, until=until)}
        for s in service.list_slos(session=session, job=job)
    ]
