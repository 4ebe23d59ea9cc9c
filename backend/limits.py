"""What every request goes through before a route sees it (a pure ASGI middleware).

FastAPI reads and parses a request's body before it runs the route's dependencies, the
token check among them; so without this, anyone could make the server buffer a body of any
size. ``RequestGuard`` therefore, in this order:

- answers ``OPTIONS`` itself: ``204`` with ``Allow`` naming the path's methods;
- refuses a request that may carry a body (``POST``, ``PUT``, ``PATCH``, ``DELETE``) to
  ``/api/`` without a valid bearer token: ``401`` before a byte of the body is read
  (the route still checks the token's scope; ingest, which reads its body itself after
  its token check, is left to do so);
- limits every body while it streams in, declared (``Content-Length``) or chunked:
  ``413`` at the first chunk past ``VIGIL_MAX_REQUEST_BYTES`` (ingest and imports:
  ``VIGIL_MAX_BODY_BYTES``, the larger limit).

    app.add_middleware(RequestGuard, settings=settings)
"""

from __future__ import annotations

import re
from typing import Any

import anyio
from fastapi.responses import JSONResponse, Response
from starlette._utils import get_route_path
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from backend.auth.service import TokenVerifier
from backend.errors import API_PREFIX, allowed_methods, code_for, error_body
from backend.settings import Settings

INGEST_PATH = "/api/v1/ingest"
BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
CHALLENGE = {"WWW-Authenticate": "Bearer"}


# Flight Recorder dumps (``backend.importers.views``) can be as large as an ingest batch.
IMPORT_PATH = re.compile(r"^/api/v1/jobs/[^/]+/imports/[^/]+$")


def body_limit(settings: Settings, path: str) -> int:
    """The largest body a request to ``path`` may send."""
    if path == INGEST_PATH or IMPORT_PATH.match(path):
        return settings.max_body_bytes
    return settings.max_request_bytes


def too_large(limit: int) -> str:
    return f"request body exceeds the {limit}-byte limit"


class RequestGuard:
    def __init__(self, app: ASGIApp, *, settings: Settings) -> None:
        self.app = app
        self.settings = settings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = get_route_path(scope)
        method = scope["method"]
        api = path.startswith(API_PREFIX)
        if method == "OPTIONS":
            allow = allowed_methods(scope["app"], scope)
            if allow:
                await Response(status_code=204, headers={"Allow": ", ".join(allow)})(
                    scope, receive, send
                )
                return
        limit = body_limit(self.settings, path)
        # Ingest checks its token, then the declared length, before it reads the body; the
        # hot path is not checked twice. Its body is still cut off past the limit here.
        if path != INGEST_PATH:
            if api and method in BODY_METHODS:
                refusal = await self._authenticate(scope)
                if refusal is not None:
                    await self._refuse(scope, receive, send, 401, refusal, CHALLENGE)
                    return
            declared = Headers(scope=scope).get("content-length", "")
            if declared.isdigit() and int(declared) > limit:
                await self._refuse(scope, receive, send, 413, too_large(limit))
                return
        await self.app(scope, _limited(receive, limit), send)

    async def _authenticate(self, scope: Scope) -> str | None:
        """Why the request's token is refused; ``None`` when it is valid."""
        header = Headers(scope=scope).get("authorization", "")
        kind, _, token = header.partition(" ")
        if kind.lower() != "bearer" or not token.strip():
            return "missing bearer token: send 'Authorization: Bearer <token>'"
        verifier: TokenVerifier = scope["app"].state.verifier
        principal = await anyio.to_thread.run_sync(verifier.verify, token.strip())
        return None if principal is not None else "invalid or revoked token"

    @staticmethod
    async def _refuse(
        scope: Scope,
        receive: Receive,
        send: Send,
        status: int,
        detail: str,
        headers: dict[str, str] | None = None,
    ) -> None:
        """Answer without reading the body; the server closes the connection after it."""
        body: Any
        if get_route_path(scope).startswith(API_PREFIX):
            body = error_body(status, code_for(status), detail)
        else:
            body = {"detail": detail}
        await JSONResponse(body, status_code=status, headers=headers)(scope, receive, send)


def _limited(receive: Receive, limit: int) -> Receive:
    """``receive``, raising ``413`` as soon as the body read so far passes ``limit``."""
    seen = 0

    async def wrapped() -> Message:
        nonlocal seen
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > limit:
                raise HTTPException(413, too_large(limit))
        return message

    return wrapped
