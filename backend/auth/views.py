"""API tokens over REST (an `admin` token): the same service as ``vigil token`` and the
dashboard's settings page.

    curl -X POST $VIGIL/api/v1/tokens -H "Authorization: Bearer $ADMIN" \\
         -d '{"name": "ranks", "scopes": ["ingest"]}'
    # 201 {"id": 3, "name": "ranks", "prefix": "vgl_Q2x9aB", …, "token": "vgl_…"}  (once)
    curl $VIGIL/api/v1/tokens -H "Authorization: Bearer $ADMIN"      # never the secrets
    curl -X DELETE $VIGIL/api/v1/tokens/3 -H "Authorization: Bearer $ADMIN"   # 204

Revoking is idempotent: revoking a revoked token answers 204 again and keeps the first
``revoked_at``; an unknown id is 404. The server that revoked a token refuses it at once;
other servers (replicas, and any server after ``vigil token revoke``) within
``VIGIL_TOKEN_CACHE_S``.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request, Response

from backend.auth import service
from backend.auth.deps import require_scope
from backend.auth.schemas import TokenCreate, TokenCreated, TokenOut
from backend.auth.verifier import TokenVerifier
from backend.deps import RowId, SessionDep
from backend.errors import NotFound, errors

router = APIRouter(
    prefix="/api/v1/tokens", tags=["tokens"], dependencies=[Depends(require_scope("admin"))]
)


@router.get("", response_model=list[TokenOut])
def list_tokens(request: Request, session: SessionDep) -> Any:
    """Every token, oldest first, revoked ones included. Never a token's secret or hash.
    `last_used_at` is written in batches (every minute); this server's newer uses show."""
    verifier: TokenVerifier = request.app.state.verifier
    rows = service.list_tokens(session=session)
    return [TokenOut.of(row, verifier.last_used(row.id)) for row in rows]


@router.post("", response_model=TokenCreated, status_code=201)
def create_token(body: TokenCreate, session: SessionDep, response: Response) -> Any:
    """Create a token. The reply carries the token itself, this once; only its hash is kept."""
    row, secret = service.create_token(session=session, name=body.name, scopes=body.scopes)
    response.headers["Cache-Control"] = "no-store"
    return TokenCreated(**TokenOut.of(row).model_dump(), token=secret)


@router.delete("/{token_id}", status_code=204, responses=errors(404))
def revoke_token(token_id: RowId, session: SessionDep) -> Response:
    """Revoke the token; revoking it again changes nothing (204). 404 if there is none."""
    if service.revoke_token(session=session, token_id=token_id) is None:
        raise NotFound(f"token {token_id} not found")
    return Response(status_code=204)
