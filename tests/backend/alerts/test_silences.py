"""Silences: matchers (job, kind, severity, rank), an expiry (on an injected clock, no
sleeps), muted notifications for incidents that still open, REST with clear 4xx and
nothing half-stored, and an audit trail."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import func, select

from backend.alerts import silences
from backend.alerts.models import Silence
from backend.alerts.service import catch_up, notify_changes, remind_open
from backend.audit.models import AuditEntry
from backend.auth.service import create_token
from backend.errors import Conflict, Invalid
from tests.backend.alerts.conftest import T0, make_incident, make_receiver
from tests.conftest import ADMIN

URL = "https://vigil.example"
HOUR = timedelta(hours=1)


def silence(session, now=T0, ends=T0 + HOUR, comment="", **matchers):  # type: ignore[no-untyped-def]
    return silences.create_silence(
        session=session,
        matchers=matchers,
        ends_at=ends,
        created_by="api:alice",
        comment=comment,
        now=now,
    )


def count(session, model) -> int:  # type: ignore[no-untyped-def]
    return int(session.scalar(select(func.count()).select_from(model)))


@pytest.mark.parametrize(
    ("matchers", "hit"),
    [
        ({"job": "llama-8b"}, True),
        ({"job": "llama-*"}, True),
        ({"job": "gpt-*"}, False),
        ({"kind": "straggler"}, True),
        ({"kind": "hang"}, False),
        ({"severity": "critical"}, True),
        ({"severity": "info"}, False),
        ({"rank": 6}, True),
        ({"rank": 5}, False),
        ({"job": "llama-8b", "kind": "straggler", "severity": "critical", "rank": 6}, True),
        ({"job": "llama-8b", "kind": "hang"}, False),  # every matcher must match
    ],
)
def test_matchers(session, matchers, hit):
    row = make_incident(session)  # llama-8b, straggler, critical, ranks [6]
    assert silences.matches(matchers, row, "llama-8b") is hit


def test_silenced_incident_opens_but_notifies_only_after_the_silence_expires(session):
    rx = make_receiver(session, "am", repeat_interval_s=60)
    silence(session, job="llama-*", kind="straggler")
    row = make_incident(session)
    other = make_incident(session, kind="hang", fingerprint="x:hang")
    made = notify_changes(
        session=session,
        opened=[row, other],
        resolved=[],
        now=T0 + timedelta(minutes=1),
        public_url=URL,
    )
    assert [d.payload["alerts"][0]["labels"]["kind"] for d in made] == ["hang"]
    assert row.status == "open"
    # While it lasts: no reminder, no catch-up.
    mid = T0 + timedelta(minutes=30)
    assert [
        d for d in remind_open(session=session, now=mid, public_url=URL) if d.incident_id == row.id
    ] == []
    assert catch_up(session=session, now=mid, public_url=URL) == []
    # Expired: the next periodic pass tells the receiver, once.
    after = T0 + HOUR + timedelta(seconds=1)
    [told] = catch_up(session=session, now=after, public_url=URL)
    assert (told.receiver_id, told.incident_id, told.status) == (rx.id, row.id, "firing")
    assert catch_up(session=session, now=after + timedelta(minutes=1), public_url=URL) == []


def test_a_pending_silence_mutes_nothing_yet(session):
    make_receiver(session, "am")
    silences.create_silence(
        session=session,
        matchers={"kind": "straggler"},
        starts_at=T0 + HOUR,
        ends_at=T0 + 2 * HOUR,
        created_by="api:alice",
        now=T0,
    )
    made = notify_changes(
        session=session, opened=[make_incident(session)], resolved=[], now=T0, public_url=URL
    )
    assert len(made) == 1
    [s] = silences.list_silences(session=session, state="pending", now=T0)
    assert (
        s.state(T0) == "pending"
        and s.state(T0 + HOUR) == "active"
        and s.state(T0 + 2 * HOUR) == "expired"
    )


def test_expire_ends_it_now_and_is_audited(session):
    s = silence(session, kind="straggler")
    silences.expire_silence(
        session=session, silence_id=s.id, actor="api:bob", now=T0 + timedelta(minutes=5)
    )
    assert s.state(T0 + timedelta(minutes=5)) == "expired" and s.expired_by == "api:bob"
    events = [e.event for e in session.scalars(select(AuditEntry).order_by(AuditEntry.id))]
    assert events == ["silence_created", "silence_expired"]
    with pytest.raises(Conflict):
        silences.expire_silence(session=session, silence_id=s.id, actor="api:bob", now=T0 + HOUR)


def test_a_silence_of_one_job_is_on_that_jobs_audit_trail(session):
    row = make_incident(session)
    silence(session, job="llama-8b", comment="draining node 7")
    [entry] = session.scalars(select(AuditEntry).where(AuditEntry.event == "silence_created"))
    assert entry.job_id == row.job_id and entry.actor == "api:alice"
    assert (
        entry.detail["matchers"] == {"job": "llama-8b"}
        and entry.detail["comment"] == "draining node 7"
    )


@pytest.mark.parametrize(
    ("matchers", "ends", "message"),
    [
        ({}, T0 + HOUR, "at least one"),
        ({"team": "ml"}, T0 + HOUR, "unknown ['team']"),
        ({"kind": "boom"}, T0 + HOUR, "matchers.kind"),
        ({"severity": "high"}, T0 + HOUR, "matchers.severity"),
        ({"rank": -1}, T0 + HOUR, "matchers.rank"),
        ({"kind": "hang"}, T0 - HOUR, "ends_at"),
        ({"kind": "hang"}, T0 + timedelta(days=400), "365 days"),
    ],
)
def test_bad_silences_are_refused_and_nothing_is_stored(session, matchers, ends, message):
    with pytest.raises(Invalid, match=message.replace("[", r"\[").replace("]", r"\]")):
        silence(session, ends=ends, **matchers)
    assert count(session, Silence) == 0 and count(session, AuditEntry) == 0


# --- REST ------------------------------------------------------------------------------------


def test_rest_create_list_get_expire(client, session):
    body = {"matchers": {"job": "llama-*", "rank": 6}, "duration_s": 7200, "comment": "drain"}
    made = client.post("/api/v1/silences", json=body, headers=ADMIN)
    assert made.status_code == 201, made.text
    s = made.json()
    assert s["state"] == "active" and s["matchers"] == {"job": "llama-*", "rank": 6}
    assert s["created_by"].startswith("api:")
    assert [x["id"] for x in client.get("/api/v1/silences?state=active", headers=ADMIN).json()] == [
        s["id"]
    ]
    assert client.get(f"/api/v1/silences/{s['id']}", headers=ADMIN).json()["comment"] == "drain"
    gone = client.delete(f"/api/v1/silences/{s['id']}", headers=ADMIN)
    assert gone.status_code == 200 and gone.json()["state"] == "expired"
    again = client.delete(f"/api/v1/silences/{s['id']}", headers=ADMIN)
    assert again.status_code == 409 and "expired" in again.json()["detail"]
    assert client.get("/api/v1/silences/999999", headers=ADMIN).status_code == 404


def test_rest_shows_the_incident_as_silenced(client, session):
    row = make_incident(session)
    session.commit()
    s = client.post(
        "/api/v1/silences",
        json={"matchers": {"kind": "straggler"}, "duration_s": 600},
        headers=ADMIN,
    ).json()
    shown = client.get(f"/api/v1/incidents/{row.id}", headers=ADMIN).json()
    assert shown["status"] == "open" and shown["silenced_by"] == [s["id"]]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"matchers": {"team": "ml"}, "duration_s": 600}, "matchers.team"),
        ({"matchers": {"kind": "boom"}, "duration_s": 600}, "matchers.kind"),
        ({"matchers": {"rank": -2}, "duration_s": 600}, "matchers.rank"),
        ({"matchers": {"rank": True}, "duration_s": 600}, "matchers.rank"),
        ({"matchers": {"kind": "hang"}, "duration_s": 5}, "duration_s"),
        ({"matchers": {"kind": "hang"}, "duration_s": True}, "duration_s"),
    ],
)
def test_rest_bad_fields_are_422_naming_the_field(client, session, body, field):
    reply = client.post("/api/v1/silences", json=body, headers=ADMIN)
    assert reply.status_code == 422, reply.text
    assert field in [d["field"] for d in reply.json()["detail"]]
    assert count(session, Silence) == 0


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"matchers": {}, "duration_s": 600}, "at least one"),
        ({"matchers": {"kind": "hang"}}, "ends_at or duration_s"),
        (
            {"matchers": {"kind": "hang"}, "duration_s": 600, "ends_at": "2099-01-01T00:00:00Z"},
            "one of them",
        ),
        ({"matchers": {"kind": "hang"}, "ends_at": "2020-01-01T00:00:00Z"}, "in the future"),
        ({"matchers": {"kind": "hang"}, "ends_at": "2099-01-01T00:00:00"}, "time zone"),
    ],
)
def test_rest_bad_silences_are_422_with_the_reason(client, session, body, words):
    reply = client.post("/api/v1/silences", json=body, headers=ADMIN)
    assert reply.status_code == 422 and words in reply.json()["detail"], reply.text
    assert count(session, Silence) == 0 and count(session, AuditEntry) == 0


def test_rest_needs_admin_to_change_silences(client, session):
    _, read = create_token(session=session, name="viewer", scopes=["read"])
    session.commit()
    reader = {"Authorization": f"Bearer {read}"}
    body = {"matchers": {"kind": "hang"}, "duration_s": 600}
    assert client.post("/api/v1/silences", json=body, headers=reader).status_code == 403
    assert client.get("/api/v1/silences", headers=reader).status_code == 200
