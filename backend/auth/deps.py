"""FastAPI dependencies that require a bearer token with a scope.

@router.get("/things", dependencies=[Depends(require_scope("read"))])
"""

from __future__ import annotations

from collections.abc import Callable

from fastapi import HTTPException, Request, status

from backend.auth.service import Principal, TokenVerifier


def require_scope(scope: str) -> Callable[[Request], Principal]:
    def dependency(request: Request) -> Principal:
        header = request.headers.get("authorization", "")
        kind, _, token = header.partition(" ")
        if kind.lower() != "bearer" or not token.strip():
            raise HTTPException(
                status.HTTP_401_UNAUTHORIZED,
                "missing bearer token: send 'Authorization: Bearer <token>'",
                headers={"WWW-Authenticate": "Bearer"},
            )
        verifier: TokenVerifier = request.app.state.verifier
        principal = verifier.verify(token.strip())
        if principal is None:
            raise HTTPException(
                status.HTTP_401_UNAUTHORIZED,
                "invalid or revoked token",
                headers={"WWW-Authenticate": "Bearer"},
            )
        if not principal.has(scope):
            raise HTTPException(
                status.HTTP_403_FORBIDDEN,
                f"this token lacks the '{scope}' scope "
                f"(it has: {', '.join(sorted(principal.scopes))})",
            )
        return principal

    dependency.__name__ = f"require_{scope}"
    return dependency
