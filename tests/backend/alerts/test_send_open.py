"""Receivers hear of incidents that were open before them: a new receiver (REST) gets the
open ones at once, the periodic pass tells the rest, and "send open incidents" resends."""

from __future__ import annotations

import json
from datetime import timedelta

from sqlalchemy import select

from backend.alerts.models import WebhookDelivery, WebhookReceiver
from backend.alerts.sender import send_due
from backend.alerts.service import catch_up, send_open, update_receiver
from backend.alerts.silences import create_silence
from backend.db import utcnow
from tests.backend.alerts.conftest import T0, make_incident, make_receiver
from tests.conftest import ADMIN

URL = "https://vigil.example"


def test_a_new_receiver_gets_the_open_incidents_grouped(client, session, receiver_server):
    """Two open incidents of a job, a resolved one, a filtered-out one, a silenced one and a
    linked consequence exist before the receiver: it is sent one notification naming the
    two, right away, and a real receiver gets it."""
    a = make_incident(session, kind="nan", fingerprint="a")
    b = make_incident(session, kind="hang", fingerprint="b")
    make_incident(session, kind="crash", fingerprint="c", status="resolved")
    make_incident(session, job="other-job", kind="nan", fingerprint="d")
    muted = make_incident(session, kind="memory_pressure", fingerprint="e")
    linked = make_incident(session, kind="slowdown", fingerprint="f")
    linked.evidence = {"consequence_of": a.id}
    create_silence(
        session=session,
        matchers={"kind": "memory_pressure"},
        ends_at=utcnow() + timedelta(hours=1),
        created_by="api:alice",
    )
    session.commit()
    body = {"name": "late", "url": receiver_server.url, "jobs": ["llama-8b"]}
    assert client.post("/api/v1/webhooks", json=body, headers=ADMIN).status_code == 201
    rx = session.scalar(select(WebhookReceiver).where(WebhookReceiver.name == "late"))
    [log] = client.get(f"/api/v1/webhooks/{rx.id}/deliveries", headers=ADMIN).json()
    assert log["incident_ids"] == [a.id, b.id] and log["status"] == "firing"
    assert muted.id not in log["incident_ids"] and linked.id not in log["incident_ids"]
    # Due at once (no group wait): the sender posts it to the real receiver.
    send_due(client.app.state.sessionmaker, settings=client.app.state.settings)
    [request] = receiver_server.requests
    sent = json.loads(request.body)
    assert sorted(int(x["labels"]["incident_id"]) for x in sent["alerts"]) == [a.id, b.id]


def test_the_periodic_pass_tells_receivers_what_they_missed_once(session):
    row = make_incident(session)
    rx = make_receiver(session, "am", enabled=False)
    assert catch_up(session=session, now=T0, public_url=URL) == []  # disabled: nothing
    update_receiver(session=session, receiver=rx, changes={"enabled": True})
    [told] = catch_up(session=session, now=T0, public_url=URL)
    assert (told.receiver_id, told.incident_id) == (rx.id, row.id)
    assert catch_up(session=session, now=T0 + timedelta(minutes=5), public_url=URL) == []


def test_send_open_again_resends_everything_open(session):
    rx = make_receiver(session, "am")
    row = make_incident(session)
    [first] = send_open(session=session, receiver=rx, public_url=URL, now=T0)
    assert send_open(session=session, receiver=rx, public_url=URL, now=T0) == []
    [again] = send_open(session=session, receiver=rx, public_url=URL, again=True, now=T0)
    assert again.id != first.id and again.incident_id == row.id


def test_send_open_endpoint(client, session):
    rx = make_receiver(session, "am")
    off = make_receiver(session, "off", enabled=False)
    row = make_incident(session)
    session.commit()
    reply = client.post(f"/api/v1/webhooks/{rx.id}/send-open", headers=ADMIN)
    assert reply.status_code == 200, reply.text
    [delivery] = reply.json()
    assert delivery["incident_ids"] == [row.id]
    refused = client.post(f"/api/v1/webhooks/{off.id}/send-open", headers=ADMIN)
    assert refused.status_code == 409 and "disabled" in refused.json()["detail"]
    assert client.post("/api/v1/webhooks/99999/send-open", headers=ADMIN).status_code == 404
    count = session.scalars(select(WebhookDelivery).where(WebhookDelivery.receiver_id == off.id))
    assert list(count) == []
