"""Errors shown as pages, not JSON: a route class turns them into an HTML response.

router = APIRouter(route_class=PageRoute)
raise PageError(404, "No job named 'x'.")        # → error.html with status 404
raise LoginRequired("/login?next=%2Fjobs%2Fx")   # → 303 to the login page
raise NotFound("job 'x' not found")              # a service's domain error: the same page
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.responses import RedirectResponse
from fastapi.routing import APIRoute
from fastapi.templating import Jinja2Templates

from backend.errors import DomainError
from frontend import TEMPLATES_DIR

templates = Jinja2Templates(directory=str(TEMPLATES_DIR))  # autoescape on for .html


class PageError(Exception):
    """Shown to the person as an error page with ``status``; ``message`` is plain text."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class LoginRequired(Exception):
    def __init__(self, location: str) -> None:
        super().__init__(location)
        self.location = location


TITLES = {
    400: "Bad request",
    401: "Sign in",
    403: "Not allowed",
    404: "Not found",
    409: "Cannot do that now",
    413: "Too large",
    415: "Unsupported form",
    422: "Check the form",
}


def error_page(request: Request, status: int, message: str) -> Response:
    from backend.ui.render import render

    context = {"status": status, "title": TITLES.get(status, "Error"), "message": message}
    return render(request, "error.html", context, status=status)


class PageRoute(APIRoute):
    """Renders ``PageError``, ``LoginRequired`` and ``DomainError`` raised by a handler or
    its dependencies (the REST API's central handler answers domain errors with JSON)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def wrapped(request: Request) -> Response:
            try:
                return await handler(request)
            except LoginRequired as exc:
                return RedirectResponse(exc.location, status_code=303)
            except PageError as exc:
                return error_page(request, exc.status, exc.message)
            except DomainError as exc:
                message = exc.detail if isinstance(exc.detail, str) else str(exc)
                return error_page(request, exc.status, message)

        return wrapped
