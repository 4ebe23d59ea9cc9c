"""The dashboard's form posts. Each checks the CSRF token (``CsrfForm``, a 403 page without
it) and, except signing in and out, the ``admin`` scope; then calls the same service as the
REST API, with ``ui:<token name>`` as the actor, and redirects back (303) with a fixed
message. Secrets made here (a token, a webhook signing secret) are shown once, on the page
the post returns, never in a URL.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import RedirectResponse
from pydantic import ValidationError

from backend.actions import service as actions
from backend.actions.models import ACTION_KINDS
from backend.alerts import sender
from backend.alerts import service as alerts
from backend.alerts.schemas import DeliveryOut, WebhookCreate
from backend.auth.service import create_token, normalize_scopes, revoke_token
from backend.db import session_scope, utcnow
from backend.deps import SessionDep
from backend.incidents.models import Incident
from backend.jobs.runs import require_live
from backend.jobs.service import get_job_id
from backend.recovery import service as recovery
from backend.ui.auth import AdminPage, CsrfForm, Form, safe_next, sign_in, sign_out, verify
from backend.ui.errors import PageError, PageRoute
from backend.ui.pages import settings_context
from backend.ui.render import render

router = APIRouter(route_class=PageRoute, include_in_schema=False)


def back(form: Form, default: str, done: str) -> Response:
    target = safe_next(form.get_str("next") or default)
    sep = "&" if "?" in target else "?"
    return RedirectResponse(f"{target}{sep}done={done}", status_code=303)


def _list(text: str) -> list[str] | None:
    items = [p.strip() for p in text.replace(",", " ").split() if p.strip()]
    return items or None


def _ranks(text: str) -> list[int] | None:
    try:
        ranks = [int(p) for p in _list(text) or []]
    except ValueError:
        raise PageError(422, "Target ranks: whole numbers separated by commas.") from None
    if any(r < 0 for r in ranks):
        raise PageError(422, "Target ranks: ranks are 0 or more.")
    return ranks or None


@router.post("/login")
def login(request: Request, form: CsrfForm) -> Response:
    token = form.get_str("token")
    who = verify(request, token)
    error = None
    if who is None:
        error = "That token is not valid (or was revoked)."
    elif not who.has("read"):
        error = "That token cannot read: sign in with a read or admin token."
    if error is not None:
        request.state.ui_principal = None
        context = {"next": safe_next(form.get_str("next")), "error": error}
        return render(request, "login.html", context, status=401)
    response = RedirectResponse(safe_next(form.get_str("next")), status_code=303)
    sign_in(request, response, token)
    return response


@router.post("/logout")
def logout(request: Request, form: CsrfForm) -> Response:
    response = RedirectResponse("/login?done=signed_out", status_code=303)
    sign_out(request, response)
    return response


@router.post("/ui/actions/{action_id}/{verb}")
def decide(
    request: Request,
    action_id: int,
    verb: str,
    form: CsrfForm,
    who: AdminPage,
    session: SessionDep,
) -> Response:
    """Approve (``force`` overrides the guards) or cancel a recovery action."""
    if verb not in ("approve", "cancel"):
        raise PageError(404, f"Unknown action verb {verb!r}.")
    actor = f"ui:{who.name}"
    try:
        if verb == "approve":
            action = recovery.approve(
                session=session,
                action_id=action_id,
                actor=actor,
                settings=request.app.state.settings,
                force=form.get_str("force") == "1",
                note=form.get_str("note")[:500],
            )
        else:
            action = recovery.cancel(
                session=session, action_id=action_id, actor=actor, note=form.get_str("note")[:500]
            )
    except recovery.NotFound:
        raise PageError(404, f"No action {action_id}.") from None
    except recovery.Conflict as exc:
        # Returned, not raised: a guard's refusal is audited, and that entry is committed.
        return render(
            request,
            "error.html",
            {"status": 409, "title": "Not done", "message": str(exc)},
            status=409,
        )
    default = f"/incidents/{action.incident_id}" if action.incident_id else "/"
    return back(form, default, "approved" if verb == "approve" else "cancelled")


@router.post("/ui/jobs/{job}/actions")
def trigger(job: str, form: CsrfForm, who: AdminPage, session: SessionDep) -> Response:
    """Trigger an action by hand; the form's nonce makes a double submit create one."""
    job_id = get_job_id(session=session, name=job)
    if job_id is None:
        raise PageError(404, f"No job named {job!r}.")
    kind = form.get_str("kind")
    if kind not in ACTION_KINDS:
        raise PageError(422, f"Kind: one of {', '.join(ACTION_KINDS)}.")
    incident_id = None
    if form.get_str("incident_id").isdigit():
        incident = session.get(Incident, int(form.get_str("incident_id")))
        incident_id = incident.id if incident is not None and incident.job_id == job_id else None
    nonce = form.get_str("nonce")[:64]
    require_live(session=session, job_id=job_id, now=utcnow())  # a 409 page saying why
    actions.create_action(
        session=session,
        job_id=job_id,
        kind=kind,
        requested_by=f"ui:{who.name}",
        target_ranks=_ranks(form.get_str("target_ranks")),
        reason=form.get_str("reason")[:2000],
        idempotency_key=f"ui:{nonce}" if nonce else None,
        incident_id=incident_id,
    )
    default = f"/incidents/{incident_id}" if incident_id else f"/jobs/{job}"
    return back(form, default, "triggered")


@router.post("/ui/webhooks")
def add_receiver(request: Request, form: CsrfForm, who: AdminPage, session: SessionDep) -> Response:
    fields: dict[str, Any] = {
        "name": form.get_str("name"),
        "url": form.get_str("url"),
        "format": form.get_str("format") or "alertmanager",
        "jobs": _list(form.get_str("jobs")),
        "kinds": _list(form.get_str("kinds")),
        "severities": _list(form.get_str("severities")),
    }
    try:
        body = WebhookCreate.model_validate(fields)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise PageError(422, f"{where}: {first['msg']}") from None
    if alerts.get_receiver_by_name(session=session, name=body.name) is not None:
        raise PageError(409, f"A receiver named {body.name!r} already exists.")
    values = body.model_dump(exclude={"name", "url"})
    receiver = alerts.create_receiver(session=session, name=body.name, url=body.url, **values)
    if receiver.format != "generic":
        return back(form, "/settings", "receiver_added")
    context = {**settings_context(session, True), "new_secret": (receiver.name, receiver.secret)}
    return render(request, "settings.html", context)


@router.post("/ui/webhooks/{receiver_id}/delete")
def delete_receiver(
    receiver_id: int, form: CsrfForm, who: AdminPage, session: SessionDep
) -> Response:
    receiver = alerts.get_receiver(session=session, receiver_id=receiver_id)
    if receiver is None:
        raise PageError(404, f"No webhook receiver {receiver_id}.")
    alerts.delete_receiver(session=session, receiver=receiver)
    return back(form, "/settings", "receiver_deleted")


@router.post("/ui/webhooks/{receiver_id}/test")
def test_receiver(request: Request, receiver_id: int, form: CsrfForm, who: AdminPage) -> Response:
    """Send a test notification now and show its outcome. No transaction is held while the
    receiver answers (as in the REST API's test endpoint)."""
    factory = request.app.state.sessionmaker
    settings = request.app.state.settings
    with session_scope(factory, write=True) as session:
        receiver = alerts.get_receiver(session=session, receiver_id=receiver_id)
        if receiver is None:
            raise PageError(404, f"No webhook receiver {receiver_id}.")
        delivery = alerts.create_test_delivery(
            session=session, receiver=receiver, public_url=settings.public_url
        )
        delivery_id, name = delivery.id, receiver.name
    sender.send_one(factory, settings=settings, delivery_id=delivery_id)
    with session_scope(factory) as session:
        result = DeliveryOut.model_validate(
            alerts.get_delivery(session=session, delivery_id=delivery_id)
        )
        context = {**settings_context(session, True), "test_result": (name, result)}
        return render(request, "settings.html", context)


@router.post("/ui/policies")
def set_policy(form: CsrfForm, who: AdminPage, session: SessionDep) -> Response:
    params_text = form.get_str("params") or "{}"
    try:
        params = json.loads(params_text)
    except ValueError:
        raise PageError(422, 'Params: a JSON object, e.g. {"allow_evict": true}.') from None
    if not isinstance(params, dict):
        raise PageError(422, 'Params: a JSON object, e.g. {"allow_evict": true}.')
    try:
        recovery.put_policy(
            session=session,
            job=form.get_str("job") or "*",
            kind=form.get_str("kind") or "*",
            mode=form.get_str("mode"),
            actor=f"ui:{who.name}",
            params=params,
        )
    except recovery.PolicyError as exc:
        raise PageError(422, str(exc)) from None
    return back(form, "/settings", "policy_set")


@router.post("/ui/tokens")
def add_token(request: Request, form: CsrfForm, who: AdminPage, session: SessionDep) -> Response:
    scopes = [s for s in ("ingest", "read", "admin") if form.get_str(f"scope_{s}") == "1"]
    name = form.get_str("name")[:128]
    if not name:
        raise PageError(422, "Name: say what the token is for.")
    try:
        normalize_scopes(scopes)
    except ValueError as exc:
        raise PageError(422, str(exc)) from None
    row, secret = create_token(session=session, name=name, scopes=scopes)
    context = {**settings_context(session, True), "new_token": (row.name, secret)}
    return render(request, "settings.html", context)


@router.post("/ui/tokens/{token_id}/revoke")
def revoke(token_id: int, form: CsrfForm, who: AdminPage, session: SessionDep) -> Response:
    if revoke_token(session=session, token_id=token_id) is None:
        raise PageError(404, f"No token {token_id}.")
    return back(form, "/settings", "token_revoked")
