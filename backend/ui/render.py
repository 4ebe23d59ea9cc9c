"""Rendering a page: the template, the context every page gets, and safe headers.

    return render(request, "job.html", {"job": job}, page={"heatmap_url": "…"})

``page`` is handed to the page's script as JSON inside a
``<script type="application/json" id="page-data">`` block (``|tojson`` escapes ``<``, ``>``
and ``&``), never as code.
"""

from __future__ import annotations

from typing import Any

from fastapi import Request, Response

from backend.ui.auth import DEV_PRINCIPAL, csrf_token, finish
from backend.ui.errors import templates

# Plotly injects <style> elements; scripts only from this origin, no eval.
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data: blob:; connect-src 'self'; font-src 'self' data:; "
    "frame-ancestors 'none'; base-uri 'none'; form-action 'self'; object-src 'none'"
)

# What a redirect's ``?done=`` shows; fixed texts, so a link cannot put words on the page.
DONE = {
    "approved": "Action approved: ranks get it with their next batch.",
    "cancelled": "Action cancelled.",
    "triggered": "Action created: ranks get it with their next batch.",
    "receiver_added": "Webhook receiver added.",
    "receiver_deleted": "Webhook receiver deleted.",
    "policy_set": "Recovery policy saved.",
    "token_revoked": "Token revoked.",
    "signed_out": "Signed out.",
    "acknowledged": "Incident acknowledged: no more reminders while it stays open.",
    "unacknowledged": "Acknowledgement taken back.",
    "resolved_by_hand": "Incident resolved; receivers that were told it fired hear it ended.",
    "silenced": "Silence created: matching incidents send no notifications until it ends.",
    "silence_expired": "Silence expired.",
    "sent_open": "The open incidents were sent to the receiver.",
    "nothing_open": "No open incident matches that receiver: nothing was sent.",
}


def secure_headers(response: Response) -> Response:
    response.headers["Content-Security-Policy"] = CSP
    response.headers["X-Frame-Options"] = "DENY"
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Referrer-Policy"] = "same-origin"
    return response


def render(
    request: Request,
    name: str,
    context: dict[str, Any],
    *,
    page: dict[str, Any] | None = None,
    status: int = 200,
) -> Response:
    """Render ``name`` with the shared context (who, CSRF token, flash message)."""
    who = getattr(request.state, "ui_principal", None)
    full = {
        "who": who,
        "anonymous_dev": who is DEV_PRINCIPAL,
        "is_admin": bool(who and who.has("admin")),
        "csrf": csrf_token(request),
        "done": DONE.get(request.query_params.get("done", "")),
        "page": page,
        **context,
    }
    response = templates.TemplateResponse(request, name, full, status_code=status)
    # Every page shows what its viewer may see (or a CSRF token): no cache keeps it.
    response.headers["Cache-Control"] = "no-store"
    return finish(request, secure_headers(response))
