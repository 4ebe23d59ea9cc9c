"""Handling alerts in the dashboard (form posts): acknowledge, resolve by hand, silence,
and send a receiver the open incidents. What the pages show of it: ``backend.ui.handling``.

Form posts follow ``backend.ui.forms``: the CSRF token (``CsrfForm``) and the ``admin``
scope (``AdminPage``), the same services as the REST API with ``ui:<token name>`` as the
actor, then a 303 back with a fixed message (``backend.ui.render.DONE``). Notifications a
post makes are queued after its commit.

    /ui/incidents/{id}/ack · /unack · /resolve (note)    /ui/silences (matchers, duration)
    /ui/silences/{id}/expire                            /ui/webhooks/{id}/send-open
"""

from __future__ import annotations

from datetime import datetime, timedelta

from fastapi import APIRouter, BackgroundTasks, Request, Response
from sqlalchemy.orm import Session

from backend.alerts import service as alerts
from backend.alerts import silences
from backend.alerts.tasks import queue_deliveries
from backend.db import utcnow
from backend.deps import SessionDep
from backend.incidents import handling
from backend.incidents.models import Incident
from backend.ui.auth import AdminPage, CsrfForm
from backend.ui.errors import PageError, PageRoute
from backend.ui.forms import back
from backend.ui.handling import DURATIONS

router = APIRouter(route_class=PageRoute, include_in_schema=False)


def _incident(session: Session, incident_id: int) -> Incident:
    row = session.get(Incident, incident_id)
    if row is None:
        raise PageError(404, f"No incident {incident_id}.")
    return row


@router.post("/ui/incidents/{incident_id}/ack")
def ack(incident_id: int, form: CsrfForm, who: AdminPage, session: SessionDep) -> Response:
    row = _incident(session, incident_id)
    handling.acknowledge(session=session, incident=row, actor=f"ui:{who.name}")
    return back(form, f"/incidents/{incident_id}", "acknowledged")


@router.post("/ui/incidents/{incident_id}/unack")
def unack(incident_id: int, form: CsrfForm, who: AdminPage, session: SessionDep) -> Response:
    row = _incident(session, incident_id)
    handling.unacknowledge(session=session, incident=row, actor=f"ui:{who.name}")
    return back(form, f"/incidents/{incident_id}", "unacknowledged")


@router.post("/ui/incidents/{incident_id}/resolve")
def resolve(
    request: Request,
    incident_id: int,
    form: CsrfForm,
    who: AdminPage,
    session: SessionDep,
    background: BackgroundTasks,
) -> Response:
    """Resolve by hand; the note is required (a 422 page says so)."""
    row = _incident(session, incident_id)
    ids = handling.resolve_by_hand(
        session=session,
        incident=row,
        actor=f"ui:{who.name}",
        note=form.get_str("note"),
        public_url=request.app.state.settings.public_url,
    )
    background.add_task(queue_deliveries, ids)
    return back(form, f"/incidents/{incident_id}", "resolved_by_hand")


def _rank(text: str) -> int | None:
    if not text:
        return None
    if not text.isdigit():
        raise PageError(422, "Rank: one rank number (0 or more), or leave it empty.")
    return int(text)


def _ends(form: CsrfForm, now: datetime) -> datetime:
    text = form.get_str("duration_s")
    allowed = {str(seconds) for seconds, _ in DURATIONS}
    if text not in allowed:
        raise PageError(422, "Duration: pick one of the choices.")
    return now + timedelta(seconds=int(text))


@router.post("/ui/silences")
def add_silence(form: CsrfForm, who: AdminPage, session: SessionDep) -> Response:
    """Silence what the matchers match (empty fields match anything; one is needed)."""
    now = utcnow()
    matchers = {
        "job": form.get_str("job") or None,
        "kind": form.get_str("kind") or None,
        "severity": form.get_str("severity") or None,
        "rank": _rank(form.get_str("rank")),
    }
    silences.create_silence(
        session=session,
        matchers=matchers,
        ends_at=_ends(form, now),
        created_by=f"ui:{who.name}",
        comment=form.get_str("comment")[:2000],
        now=now,
    )
    return back(form, "/alerts", "silenced")


@router.post("/ui/silences/{silence_id}/expire")
def expire(silence_id: int, form: CsrfForm, who: AdminPage, session: SessionDep) -> Response:
    silences.expire_silence(session=session, silence_id=silence_id, actor=f"ui:{who.name}")
    return back(form, "/alerts", "silence_expired")


@router.post("/ui/webhooks/{receiver_id}/send-open")
def send_open(
    request: Request,
    receiver_id: int,
    form: CsrfForm,
    who: AdminPage,
    session: SessionDep,
    background: BackgroundTasks,
) -> Response:
    """Send the receiver the incidents open now (grouped, at once)."""
    receiver = alerts.get_receiver(session=session, receiver_id=receiver_id)
    if receiver is None:
        raise PageError(404, f"No webhook receiver {receiver_id}.")
    sent = alerts.send_open(
        session=session,
        receiver=receiver,
        public_url=request.app.state.settings.public_url,
        again=True,
        wait_s=0,
    )
    background.add_task(queue_deliveries, [d.id for d in sent])
    return back(form, "/alerts", "sent_open" if sent else "nothing_open")
