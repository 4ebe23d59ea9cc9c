"""Who is looking at the dashboard, and whether a form post is really theirs.

Signing in: a person pastes an API token on ``/login``; it is verified with the app's
``TokenVerifier`` and kept in an HttpOnly, SameSite=Lax cookie (``vigil_token``), verified
again on every request, so revoking the token signs the browser out. In the
``development`` environment a browser without the cookie acts as the dev admin, so
``vigil demo`` opens straight away; in production it is sent to ``/login``. A bearer header
works too (scripts, tests), and wins over the cookie.

CSRF: every browser gets a random session id (``vigil_sid``, HttpOnly, SameSite=Lax),
rotated at login and logout. Forms carry ``csrf_token = HMAC(key, sid)``; every POST is
checked against it (and against ``Origin`` when the browser sends one) and refused with
403 otherwise, in development too. The key comes from ``VIGIL_ADMIN_TOKEN`` when set (so
API replicas agree), else it is random per process.

    @router.get("/thing")
    def page(who: ReadPage): ...                  # 303 to /login, or a 403 page
    @router.post("/thing")
    def act(form: CsrfForm, who: AdminPage): ...   # 403 page without a valid token
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Callable
from typing import Annotated
from urllib.parse import parse_qs, quote, urlsplit

from fastapi import Depends, HTTPException, Request, Response

from backend.auth.service import Principal, TokenVerifier
from backend.ui.errors import LoginRequired, PageError

TOKEN_COOKIE = "vigil_token"
SID_COOKIE = "vigil_sid"
CSRF_FIELD = "csrf_token"
LOGIN_MAX_AGE_S = 12 * 3600
MAX_FORM_BYTES = 64 * 1024
DEV_PRINCIPAL = Principal("dev-admin", frozenset({"admin", "read", "ingest"}))


class Form(dict[str, str]):
    """A posted urlencoded form: the first value of each field, stripped."""

    def get_str(self, key: str, default: str = "") -> str:
        return self.get(key, default).strip()


def _key(request: Request) -> bytes:
    state = request.app.state
    key: bytes | None = getattr(state, "ui_csrf_key", None)
    if key is None:
        admin = state.settings.admin_token
        if admin is not None:
            key = hashlib.sha256(b"vigil-ui-csrf\0" + admin.get_secret_value().encode()).digest()
        else:
            key = secrets.token_bytes(32)
        state.ui_csrf_key = key
    return key


def csrf_for(request: Request, sid: str) -> str:
    return hmac.new(_key(request), b"csrf\0" + sid.encode(), hashlib.sha256).hexdigest()


def session_id(request: Request) -> str:
    """The browser's session id; a new one (set on the response by ``finish``) if it has
    none yet. Stored on ``request.state`` so one request uses one id."""
    sid: str | None = getattr(request.state, "ui_sid", None)
    if sid is None:
        cookie = request.cookies.get(SID_COOKIE, "")
        sid = cookie if 20 <= len(cookie) <= 100 else secrets.token_urlsafe(32)
        request.state.ui_sid = sid
    return sid


def csrf_token(request: Request) -> str:
    """The token to put in this page's forms."""
    return csrf_for(request, session_id(request))


def _secure(request: Request) -> bool:
    return request.url.scheme == "https" or str(request.app.state.settings.public_url).startswith(
        "https://"
    )


def finish(request: Request, response: Response) -> Response:
    """Set the session-id cookie if this request created (or rotated) it."""
    sid = getattr(request.state, "ui_sid", None)
    if sid is not None and request.cookies.get(SID_COOKIE) != sid:
        response.set_cookie(
            SID_COOKIE, sid, httponly=True, samesite="lax", secure=_secure(request), path="/"
        )
    return response


def sign_in(request: Request, response: Response, token: str) -> None:
    """Keep ``token`` in the browser and rotate the session id (no fixation)."""
    request.state.ui_sid = secrets.token_urlsafe(32)
    response.set_cookie(
        TOKEN_COOKIE,
        token,
        max_age=LOGIN_MAX_AGE_S,
        httponly=True,
        samesite="lax",
        secure=_secure(request),
        path="/",
    )
    finish(request, response)


def sign_out(request: Request, response: Response) -> None:
    request.state.ui_sid = secrets.token_urlsafe(32)
    response.delete_cookie(TOKEN_COOKIE, path="/")
    finish(request, response)


def verify(request: Request, token: str) -> Principal | None:
    verifier: TokenVerifier = request.app.state.verifier
    return verifier.verify(token.strip()) if token.strip() else None


def principal(request: Request) -> Principal | None:
    """The bearer token's principal, else the cookie's, else the dev admin in development.
    ``None``: nobody signed in (or an invalid or revoked token)."""
    header = request.headers.get("authorization", "")
    kind, _, token = header.partition(" ")
    if kind.lower() == "bearer" and token.strip():
        return verify(request, token)
    cookie = request.cookies.get(TOKEN_COOKIE)
    if cookie:
        return verify(request, cookie)
    if request.app.state.settings.env == "development":
        return DEV_PRINCIPAL
    return None


def safe_next(value: str | None) -> str:
    """A local path to go back to after signing in; anything else becomes ``/``."""
    if not value or not value.startswith("/") or value.startswith("//") or "\\" in value:
        return "/"
    parts = urlsplit(value)
    if parts.scheme or parts.netloc:
        return "/"
    return value


def login_url(request: Request) -> str:
    here = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return "/login?next=" + quote(safe_next(here), safe="")


def page_scope(scope: str) -> Callable[[Request], Principal]:
    """Dependency for HTML pages: the principal, which must have ``scope``."""

    def dependency(request: Request) -> Principal:
        who = principal(request)
        if who is None:
            raise LoginRequired(login_url(request))
        if not who.has(scope):
            raise PageError(
                403,
                f"This needs the '{scope}' scope; you are signed in as {who.name!r} "
                f"with: {', '.join(sorted(who.scopes))}.",
            )
        request.state.ui_principal = who
        return who

    dependency.__name__ = f"page_{scope}"
    return dependency


def api_scope(scope: str) -> Callable[[Request], Principal]:
    """Dependency for the dashboard's JSON: like the API (401/403 JSON), cookie allowed."""

    def dependency(request: Request) -> Principal:
        who = principal(request)
        if who is None:
            raise HTTPException(401, "sign in on /login or send 'Authorization: Bearer <token>'")
        if not who.has(scope):
            raise HTTPException(403, f"this token lacks the '{scope}' scope")
        return who

    dependency.__name__ = f"api_{scope}"
    return dependency


def _same_origin(request: Request) -> bool:
    """No ``Origin`` (older browsers, curl) passes; one naming another site does not. The
    host a reverse proxy forwards and ``VIGIL_PUBLIC_URL``'s host are both this site."""
    origin = request.headers.get("origin")
    if origin is None:
        return True
    ours = {request.headers.get("host", ""), urlsplit(request.app.state.settings.public_url).netloc}
    return urlsplit(origin).netloc in ours


async def csrf_form(request: Request) -> Form:
    """Parse a urlencoded POST body and check its CSRF token; a 403 page otherwise."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    body = await request.body()
    if body and kind != "application/x-www-form-urlencoded":
        raise PageError(415, "Send the form as application/x-www-form-urlencoded.")
    if len(body) > MAX_FORM_BYTES:
        raise PageError(413, "The form is too large.")
    try:
        parsed = parse_qs(body.decode("utf-8"), keep_blank_values=True, max_num_fields=200)
    except (UnicodeDecodeError, ValueError):
        raise PageError(400, "The form could not be read.") from None
    form = Form({k: v[0] for k, v in parsed.items()})
    sid = request.cookies.get(SID_COOKIE, "")
    sent = form.pop(CSRF_FIELD, "")
    expected = csrf_for(request, sid) if sid else ""
    if not _same_origin(request) or not sid or not hmac.compare_digest(sent, expected):
        raise PageError(
            403,
            "The form's security token is missing or stale (CSRF check). "
            "Reload the page and try again.",
        )
    return form


ReadPage = Annotated[Principal, Depends(page_scope("read"))]
AdminPage = Annotated[Principal, Depends(page_scope("admin"))]
ReadApi = Annotated[Principal, Depends(api_scope("read"))]
CsrfForm = Annotated[Form, Depends(csrf_form)]
