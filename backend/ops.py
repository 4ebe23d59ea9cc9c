"""Operator endpoints, and what keeps private answers out of caches.

    GET /metrics                       Prometheus text (Vigil itself and the jobs it sees)
    GET /docs, /openapi.json           the API's documentation (Swagger UI); /redoc: to /docs
    GET /static/apidocs/{file}         Swagger UI's files, from this server

``/docs`` needs no internet: Swagger UI 5 (it reads OpenAPI 3.1, which FastAPI writes) is served
from the copy the ``fastapi-offline`` package installs and started by ``/static/api_docs.js``:
no inline script, as the page sends the dashboard's Content-Security-Policy
(``script-src 'self'``). ReDoc is not served: its bundle loads its logo from a CDN.

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
from importlib.resources import files
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Request, Response
from fastapi.openapi.docs import get_swagger_ui_oauth2_redirect_html
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, RedirectResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from backend.telemetry.prometheus import exposition
from backend.ui.auth import principal
from backend.ui.errors import templates
from backend.ui.render import secure_headers

OPENAPI_URL = "/openapi.json"
OAUTH2_REDIRECT_URL = "/docs/oauth2-redirect"
ASSETS_URL = "/static/apidocs"
ASSETS_DIR = Path(str(files("fastapi_offline") / "static"))
ASSETS = {
    "swagger-ui-bundle.js": "text/javascript",
    "swagger-ui.css": "text/css",
    "favicon.png": "image/png",
}


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
def swagger(request: Request) -> Response:
    context = {
        "title": f"{request.app.title} - API",
        "assets": ASSETS_URL,
        "config": {"openapi_url": OPENAPI_URL, "oauth2_redirect_url": OAUTH2_REDIRECT_URL},
    }
    return secure_headers(templates.TemplateResponse(request, "api_docs.html", context))


@router.get(OAUTH2_REDIRECT_URL)
def swagger_redirect() -> HTMLResponse:
    return get_swagger_ui_oauth2_redirect_html()


@router.get("/redoc", dependencies=DOCS)
def redoc() -> RedirectResponse:
    """ReDoc is not served (its bundle loads its logo from a CDN): the same docs are at /docs."""
    return RedirectResponse("/docs", status_code=307)


@router.get(ASSETS_URL + "/{name}")
def docs_asset(name: str) -> FileResponse:
    """One of Swagger UI's files (public, like the rest of ``/static``)."""
    if name not in ASSETS:
        raise HTTPException(404, f"no file {name!r} here")
    return FileResponse(ASSETS_DIR / name, media_type=ASSETS[name])


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
