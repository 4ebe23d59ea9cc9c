"""Operator endpoints, and what keeps private answers out of caches.

    GET /metrics                       Prometheus text (Vigil itself and the jobs it sees)
    GET /docs, /redoc, /openapi.json   the API's documentation

In development they answer anyone. In production they need a token with the ``read`` scope
(a bearer header, e.g. Prometheus's ``authorization: {credentials: …}``, or the dashboard's
sign-in cookie, so ``/docs`` opens in a signed-in browser) unless ``VIGIL_METRICS_PUBLIC``
or ``VIGIL_DOCS_PUBLIC`` says otherwise; a missing token is 401, one without ``read`` 403.

``NoStore`` adds ``Cache-Control: no-store`` to every answer that sets no ``Cache-Control``
of its own, except ``/static/``: pages behind a sign-in, API data, tokens and secrets are
never kept by a browser or a proxy cache.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Request, Response
from fastapi.openapi.docs import (
    get_redoc_html,
    get_swagger_ui_html,
    get_swagger_ui_oauth2_redirect_html,
)
from fastapi.responses import HTMLResponse, JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from backend.telemetry.prometheus import exposition
from backend.ui.auth import principal

OPENAPI_URL = "/openapi.json"
OAUTH2_REDIRECT_URL = "/docs/oauth2-redirect"


def ops_scope(what: str) -> Callable[[Request], None]:
    """Dependency: ``what`` ("metrics" or "docs") is public, or the caller can read."""

    def dependency(request: Request) -> None:
        metrics_public, docs_public = request.app.state.settings.ops_public
        if metrics_public if what == "metrics" else docs_public:
            return
        who = principal(request)
        if who is None:
            raise HTTPException(
                401,
                f"{what} need a token with the 'read' scope: send 'Authorization: Bearer "
                f"<token>' (or set VIGIL_{what.upper()}_PUBLIC=true)",
                headers={"WWW-Authenticate": "Bearer"},
            )
        if not who.has("read"):
            raise HTTPException(403, f"this token lacks the 'read' scope {what} need")

    dependency.__name__ = f"ops_{what}"
    return dependency


router = APIRouter(tags=["ops"], include_in_schema=False)
METRICS = [Depends(ops_scope("metrics"))]
DOCS = [Depends(ops_scope("docs"))]


@router.get("/metrics", dependencies=METRICS)
def metrics(request: Request) -> Response:
    body = exposition(request.app.state.sessionmaker)
    return Response(body, media_type=CONTENT_TYPE_LATEST)


@router.get(OPENAPI_URL, dependencies=DOCS)
def openapi(request: Request) -> JSONResponse:
    schema: dict[str, Any] = request.app.openapi()
    return JSONResponse(schema)


@router.get("/docs", dependencies=DOCS)
def swagger(request: Request) -> HTMLResponse:
    return get_swagger_ui_html(
        openapi_url=OPENAPI_URL,
        title=f"{request.app.title} - API",
        oauth2_redirect_url=OAUTH2_REDIRECT_URL,
    )


@router.get(OAUTH2_REDIRECT_URL)
def swagger_redirect() -> HTMLResponse:
    return get_swagger_ui_oauth2_redirect_html()


@router.get("/redoc", dependencies=DOCS)
def redoc(request: Request) -> HTMLResponse:
    return get_redoc_html(openapi_url=OPENAPI_URL, title=f"{request.app.title} - API")


class NoStore:
    """ASGI middleware: ``Cache-Control: no-store`` unless the answer sets its own."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"].startswith("/static/"):
            await self.app(scope, receive, send)
            return

        async def send_no_store(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                if not any(key.lower() == b"cache-control" for key, _ in headers):
                    headers.append((b"cache-control", b"no-store"))
                    message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_no_store)
