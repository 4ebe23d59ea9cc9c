"""API tokens over REST (an `admin` token): the same service as ``vigil token`` and the
dashboard's settings page.

    curl -X POST $VIGIL/api/v1/tokens -H "Authorization: Bearer $ADMIN" \\
         -d '{"name": "ranks", "scopes": ["ingest"]}'
    # 201 {"id": 3, "name": "ranks", "prefix": "vgl_Q2x9aB", …, "token": "vgl_…"}  (once)
    curl $VIGIL/api/v1/tokens -H "Authorization: Bearer $ADMIN"      # never the secrets
    curl -X DELETE $VIGIL/api/v1/tokens/3 -H "Authorization: Bearer $ADMIN"   # 204

Revoking is idempotent: revoking a revoked token answers 204 again and keeps the first
``revoked_at``; an unknown id is 404. Servers stop accepting a revoked token within
``VIGIL_TOKEN_CACHE_S``.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Response

from backend.auth import service
from backend.auth.deps import require_scope
from backend.auth.schemas import TokenCreate, TokenCreated, TokenOut
from backend.deps import SessionDep
from backend.errors import NotFound

router = APIRouter(
    prefix="/api/v1/tokens", tags=["tokens"], dependencies=[Depends(require_scope("admin"))]
)


@router.get("", response_model=list[TokenOut])
def list_tokens(session: SessionDep) -> Any:
    """Every token, oldest first, revoked ones included. Never a token's secret or hash."""
    return [TokenOut.of(row) for row in service.list_tokens(session=session)]


@router.post("", response_model=TokenCreated, status_code=201)
def create_token(body: TokenCreate, session: SessionDep, response: Response) -> Any:
    """Create a token. The reply carries the token itself, this once; only its hash is kept."""
    row, secret = service.create_token(session=session, name=body.name, scopes=body.scopes)
    response.headers["Cache-Control"] = "no-store"
    return TokenCreated(**TokenOut.of(row).model_dump(), token=secret)


@router.delete("/{token_id}", status_code=204)
def revoke_token(token_id: int, session: SessionDep) -> Response:
    """Revoke the token; revoking it again changes nothing (204). 404 if there is none."""
    if service.revoke_token(session=session, token_id=token_id) is None:
        raise NotFound(f"token {token_id} not found")
    return Response(status_code=204)
