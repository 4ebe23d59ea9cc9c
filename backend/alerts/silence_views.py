"""Silences over REST (mounted under ``/api/v1`` by ``backend.alerts.views``): list and
read with a `read` token, create and expire with an `admin` token.

    curl -X POST $VIGIL/api/v1/silences -H "Authorization: Bearer $ADMIN" \\
         -d '{"matchers": {"job": "llama-*", "kind": "straggler"}, "duration_s": 7200,
              "comment": "node 7 is being drained"}'
    curl -X DELETE $VIGIL/api/v1/silences/3 -H "Authorization: Bearer $ADMIN"   # expire
"""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query

from backend.alerts import silences
from backend.alerts.schemas import SilenceCreate, SilenceOut
from backend.auth.deps import require_scope
from backend.auth.service import Principal
from backend.db import utcnow
from backend.deps import RowId, SessionDep
from backend.errors import Invalid, NotFound, errors

router = APIRouter(tags=["silences"])
READ = [Depends(require_scope("read"))]
Admin = Annotated[Principal, Depends(require_scope("admin"))]


@router.get("/silences", response_model=list[SilenceOut], dependencies=READ)
def list_silences(
    session: SessionDep,
    state: Annotated[Literal["pending", "active", "expired"] | None, Query()] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 200,
) -> Any:
    """Silences, newest first; `state` picks pending, active or expired ones."""
    now = utcnow()
    rows = silences.list_silences(session=session, state=state, now=now, limit=limit)
    return [SilenceOut.of(r, now) for r in rows]


@router.post("/silences", response_model=SilenceOut, status_code=201, responses=errors(422))
def create_silence(body: SilenceCreate, session: SessionDep, principal: Admin) -> Any:
    """Mute notifications for the incidents the matchers match until `ends_at` (or for
    `duration_s`). Matched incidents still open and show as silenced. 422 for unknown or
    missing matchers, and an expiry that is not in the future."""
    now = utcnow()
    starts = body.starts_at or now
    if (body.ends_at is None) == (body.duration_s is None):
        raise Invalid("give ends_at or duration_s (one of them)")
    ends = body.ends_at or starts + timedelta(seconds=body.duration_s or 0)
    row = silences.create_silence(
        session=session,
        matchers=body.matchers.given(),
        starts_at=starts,
        ends_at=ends,
        created_by=f"api:{principal.name}",
        comment=body.comment,
        now=now,
    )
    return SilenceOut.of(row, now)


@router.get(
    "/silences/{silence_id}", response_model=SilenceOut, dependencies=READ, responses=errors(404)
)
def get_silence(silence_id: RowId, session: SessionDep) -> Any:
    row = silences.get_silence(session=session, silence_id=silence_id)
    if row is None:
        raise NotFound(f"silence {silence_id} not found")
    return SilenceOut.of(row, utcnow())


@router.delete("/silences/{silence_id}", response_model=SilenceOut, responses=errors(404, 409))
def expire_silence(silence_id: RowId, session: SessionDep, principal: Admin) -> Any:
    """Expire the silence now (it is kept, as expired). 409 if it has ended already."""
    now = utcnow()
    row = silences.expire_silence(
        session=session, silence_id=silence_id, actor=f"api:{principal.name}", now=now
    )
    return SilenceOut.of(row, now)
