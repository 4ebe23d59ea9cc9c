"""Domain errors, raised by services and mapped to HTTP once, by the app's central handler.

Services raise these; views do not translate them (``backend.api`` calls
``install_error_handlers(app)``):

    from backend.errors import Conflict, NotFound
    raise NotFound(f"job {name!r} not found")                 # → 404
    raise Conflict(f"action 7 is succeeded already", extra={"state": "succeeded"})  # → 409

Every 4xx/5xx of the REST API has one body shape (see README, "Errors"):

    {"error": "not_found", "status": 404, "detail": "job 'x' not found"}

``detail`` is a human-readable string, or for invalid fields a list of
``{"field": "events[3].duration_s", "msg": …, "type": …}``; ``extra`` keys are added at the
top level (e.g. ``guards`` on a refused approval). HTTP-level refusals (a missing token, a
body too large, ``429``) stay ``HTTPException`` and get the same body, ``error`` named
after the status (``CODES``); an unexpected exception is a 500 that names nothing internal.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.encoders import jsonable_encoder
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette._utils import get_route_path
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Scope

log = logging.getLogger(__name__)


class DomainError(Exception):
    """Base of every error the API maps to a status code. The message is for the caller."""

    status = 400
    code = "bad_request"

    def __init__(self, detail: Any, *, extra: dict[str, Any] | None = None) -> None:
        super().__init__(detail if isinstance(detail, str) else repr(detail))
        self.detail = detail
        self.extra = extra or {}


class NotFound(DomainError, LookupError):
    status = 404
    code = "not_found"


class Conflict(DomainError):
    """The thing's current state does not allow the request."""

    status = 409
    code = "conflict"


class Invalid(DomainError, ValueError):
    """A value the caller sent is not acceptable (beyond what the schema checks)."""

    status = 422
    code = "invalid"


# --- the body, as the OpenAPI document describes it ----------------------------------------


class FieldError(BaseModel):
    """One invalid field of a request."""

    field: str = Field(examples=["events[3].duration_s"], description="Where, as a path.")
    msg: str = Field(description="What is wrong with it.")
    type: str = Field(examples=["greater_than_equal"], description="The kind of error.")
    loc: list[int | str] | None = Field(
        None, description="The location as pydantic gives it (request validation only)."
    )


class ErrorOut(BaseModel):
    """The body of every 4xx/5xx of the REST API; some errors add keys (e.g. ``guards``)."""

    model_config = ConfigDict(extra="allow")

    error: str = Field(examples=["not_found"], description="The error's code.")
    status: int = Field(examples=[404], description="The HTTP status, repeated.")
    detail: str | list[FieldError] = Field(
        description="A message, or for invalid fields the list of them."
    )


# What each documented error status means, for ``responses=`` of the routes.
ERROR_DESCRIPTIONS = {
    400: "Bad request: the body could not be parsed",
    401: "Missing, invalid or revoked token",
    403: "The token lacks the scope",
    404: "Not found",
    409: "Conflict with the current state",
    413: "Request body too large",
    415: "Unsupported media type or encoding",
    422: "Invalid input; `detail` names the fields",
    429: "Too many requests; honour `Retry-After`",
    503: "Unavailable; honour `Retry-After`",
}


def errors(*statuses: int, **descriptions: str) -> dict[int | str, dict[str, Any]]:
    """``responses=`` for a route: each status with the one error body.

    >>> @router.get("/jobs/{job}", responses=errors(404))          # doctest: +SKIP
    """
    out: dict[int | str, dict[str, Any]] = {}
    for status in statuses:
        text = descriptions.get(f"e{status}") or ERROR_DESCRIPTIONS.get(status) or code_for(status)
        out[status] = {"model": ErrorOut, "description": text}
    return out


# --- the central handlers ------------------------------------------------------------------

API_PREFIX = "/api/"
INTERNAL_DETAIL = "internal error; see the server log"
MAX_FIELD_ERRORS = 50  # of a request's invalid fields, the first ones are named
# A message may quote what was sent ("unknown kind '…'"): past this length only its start
# and end are kept, so an error never echoes a huge input (nor costs the time to encode it).
MAX_MESSAGE_CHARS = 400

# ``error`` for an HTTP status (HTTPException: auth, routing, size and media limits, 429).
CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "too_large",
    415: "unsupported_media_type",
    422: "invalid",
    429: "throttled",
    500: "internal",
    503: "unavailable",
}


def code_for(status: int) -> str:
    """``404`` → ``"not_found"``; statuses not in ``CODES`` get their snake-cased phrase."""
    if status in CODES:
        return CODES[status]
    try:
        return HTTPStatus(status).phrase.lower().replace(" ", "_").replace("-", "_")
    except ValueError:
        return "error"


def excerpt(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """``text`` if short; else its start and its end (where a message's advice usually is)
    around a note of how much was cut."""
    if len(text) <= limit:
        return text
    keep = limit // 2
    return f"{text[:keep]}…[{len(text) - 2 * keep} characters cut]…{text[-keep:]}"


def clipped(value: Any, depth: int = 0) -> Any:
    """``value`` with every string cut to an excerpt and lists to ``MAX_FIELD_ERRORS``."""
    if isinstance(value, str):
        return excerpt(value)
    if depth > 4:
        return excerpt(repr(value))
    if isinstance(value, list | tuple):
        return [clipped(v, depth + 1) for v in value[:MAX_FIELD_ERRORS]]
    if isinstance(value, dict):
        items = list(value.items())[:MAX_FIELD_ERRORS]
        return {excerpt(str(k)): clipped(v, depth + 1) for k, v in items}
    return value


def error_body(status: int, code: str, detail: Any, extra: dict[str, Any] | None = None) -> Any:
    """The one error body: ``error``, ``status``, ``detail``, then any extra keys."""
    body: dict[str, Any] = {"error": code, "status": status, "detail": clipped(detail)}
    for key, value in (extra or {}).items():
        body.setdefault(key, value)  # the three keys above always win
    return jsonable_encoder(body)


def field_path(loc: Sequence[int | str]) -> str:
    """A pydantic error location as a field path: ``('body', 'kinds', 1)`` → ``'kinds[1]'``,
    ``('query', 'limit')`` → ``'query.limit'``; a request body's own fields drop ``body``."""
    parts = list(loc[1:] if loc and loc[0] == "body" and len(loc) > 1 else loc)
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "body"


def is_api(request: Request) -> bool:
    """Whether the request is for the REST API (JSON errors), not a page of the dashboard."""
    path: str = request.scope["path"]
    root: str = request.scope.get("root_path", "")
    if root and path.startswith(root):
        path = path[len(root) :]
    return path.startswith(API_PREFIX)


def error_response(exc: DomainError) -> JSONResponse:
    """The response for a domain error. Views return it only when the request's transaction
    must still commit (a refusal that writes its audit entry); otherwise they raise."""
    return JSONResponse(error_body(exc.status, exc.code, exc.detail, exc.extra), exc.status)


async def domain_error_handler(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, DomainError)
    return error_response(exc)


def allowed_methods(app: Any, scope: Scope) -> list[str]:
    """Every method some route of ``app`` answers on this request's path (``OPTIONS``
    included when there is one), for ``Allow``; empty when no route has the path."""
    path = get_route_path(scope)
    methods: set[str] = set()
    for route in getattr(app, "routes", ()):
        # Included routers (FastAPI) expand to their routes with the full path.
        expand = getattr(route, "effective_route_contexts", None)
        for candidate in expand() if expand is not None else (route,):
            regex = getattr(candidate, "path_regex", None)
            found = getattr(candidate, "methods", None)
            if regex is not None and found and regex.match(path):
                methods.update(found)
    return sorted(methods | {"OPTIONS"}) if methods else []


async def http_error_handler(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code == 405:  # Starlette names only the first route's methods
        allow = allowed_methods(request.app, request.scope)
        if allow:
            exc.headers = {**(exc.headers or {}), "Allow": ", ".join(allow)}
    if not is_api(request) or exc.status_code < 400:
        return await http_exception_handler(request, exc)  # FastAPI's own, as before
    body = error_body(exc.status_code, code_for(exc.status_code), exc.detail)
    return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)


async def validation_error_handler(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    if not is_api(request):  # FastAPI's body, with each echoed ``input`` cut to an excerpt
        return JSONResponse({"detail": clipped(jsonable_encoder(exc.errors()))}, status_code=422)
    detail = [
        {
            "field": field_path(e["loc"]),
            "msg": excerpt(str(e["msg"]).removeprefix("Value error, ")),
            "type": e["type"],
            "loc": list(e["loc"]),
        }
        for e in list(exc.errors())[:MAX_FIELD_ERRORS]
    ]
    return JSONResponse(error_body(422, "invalid", detail), status_code=422)


async def unhandled_error_handler(request: Request, exc: Exception) -> Response:
    """A bug: logged with its traceback; the caller learns nothing of the internals."""
    log.error("unhandled error in %s %s", request.method, request.url.path, exc_info=exc)
    if not is_api(request):
        return PlainTextResponse("Internal Server Error", status_code=500)  # Starlette's
    return JSONResponse(error_body(500, "internal", INTERNAL_DETAIL), status_code=500)


def install_error_handlers(app: FastAPI) -> None:
    """Map every error to the one body, for paths under ``/api/``.

    Other paths (the dashboard) keep FastAPI's answers; its pages render their own errors
    (``backend.ui.errors.PageRoute``), domain errors included.
    """
    app.add_exception_handler(DomainError, domain_error_handler)
    app.add_exception_handler(StarletteHTTPException, http_error_handler)
    app.add_exception_handler(RequestValidationError, validation_error_handler)
    app.add_exception_handler(Exception, unhandled_error_handler)
