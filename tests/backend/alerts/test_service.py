"""Deliveries are written when incidents change: filters, one per change, reminders."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import select

from backend.alerts import formats
from backend.alerts.group_formats import build_group
from backend.alerts.models import WebhookDelivery
from backend.alerts.service import (
    create_test_delivery,
    list_deliveries,
    notify_changes,
    remind_open,
    update_receiver,
)
from tests.backend.alerts.conftest import T0, make_incident, make_receiver, resolve

URL = "https://vigil.example"


def notify(session, opened=(), resolved=(), now=T0):  # type: ignore[no-untyped-def]
    return notify_changes(
        session=session, opened=list(opened), resolved=list(resolved), now=now, public_url=URL
    )


def sent(session, status=None):  # type: ignore[no-untyped-def]
    query = select(WebhookDelivery).order_by(WebhookDelivery.id)
    if status:
        query = query.where(WebhookDelivery.status == status)
    return list(session.scalars(query))


def test_no_receivers_no_deliveries(session):
    assert notify(session, opened=[make_incident(session)]) == []


def test_filters_pick_receivers(session):
    everyone = make_receiver(session, "everyone")
    by_job = make_receiver(session, "by-job", jobs=["other-job"])
    by_kind = make_receiver(session, "by-kind", kinds=["hang", "straggler"])
    by_severity = make_receiver(session, "by-severity", severities=["info"])
    off = make_receiver(session, "off", enabled=False)
    row = make_incident(session, kind="straggler", severity="critical")
    created = notify(session, opened=[row])
    assert sorted(d.receiver_id for d in created) == sorted([everyone.id, by_kind.id])
    other = make_incident(session, job="other-job", kind="nan", severity="info")
    created = notify(session, opened=[other])
    assert sorted(d.receiver_id for d in created) == sorted(
        [everyone.id, by_job.id, by_severity.id]
    )
    assert off.id not in {d.receiver_id for d in sent(session)}


def test_one_delivery_per_state_change(session):
    am = make_receiver(session, "am")
    quiet = make_receiver(session, "quiet", send_resolved=False)
    row = make_incident(session)
    [first, second] = notify(session, opened=[row, row])  # repeated: still one per receiver
    assert {first.receiver_id, second.receiver_id} == {am.id, quiet.id}
    assert (first.status, first.state, first.attempts, first.incident_id) == (
        "firing",
        "pending",
        0,
        row.id,
    )
    assert first.next_attempt_at == T0
    assert first.webhook_id != second.webhook_id
    # The frozen payload is exactly what the format builds, for a group of one (by job).
    assert first.payload == build_group(
        "alertmanager",
        incidents=[(row, "llama-8b")],
        status="firing",
        receiver="am",
        group_labels={"job": "llama-8b"},
        public_url=URL,
        now=T0,
    )
    assert (
        first.payload["alerts"]
        == formats.build(
            "alertmanager",
            incident=row,
            job="llama-8b",
            status="firing",
            receiver="am",
            public_url=URL,
            now=T0,
        )["alerts"]
    )
    resolve(session, row, T0 + timedelta(minutes=3))
    [done] = notify(session, resolved=[row], now=T0 + timedelta(minutes=3))
    assert (done.receiver_id, done.status) == (am.id, "resolved")
    assert done.payload["alerts"][0]["endsAt"] == "2024-11-22T00:13:00Z"


def test_resolved_goes_only_where_firing_went(session):
    make_receiver(session, "am")
    row = make_incident(session)
    notify(session, opened=[row])
    late = make_receiver(session, "added-later")
    resolve(session, row, T0 + timedelta(minutes=1))
    [done] = notify(session, resolved=[row])
    assert done.receiver_id != late.id


def test_resolved_reaches_a_receiver_whose_filter_no_longer_matches(session):
    critical = make_receiver(session, "critical-only", severities=["critical"])
    row = make_incident(session, severity="critical")
    notify(session, opened=[row])
    row.severity = "warning"  # the incident calmed down before it cleared
    resolve(session, row, T0 + timedelta(minutes=1))
    [done] = notify(session, resolved=[row])
    assert done.receiver_id == critical.id


def test_transient_incident_fires_then_resolves(session):
    make_receiver(session, "am")
    row = make_incident(session, status="resolved")
    created = notify(session, opened=[row])
    assert [d.status for d in created] == ["firing", "resolved"]


def test_generic_and_slack_payloads(session):
    make_receiver(session, "hook", format="generic")
    make_receiver(session, "chat", format="slack", url="https://hooks.slack.com/services/T/B/X")
    row = make_incident(session)
    generic, chat = notify(session, opened=[row])
    assert generic.payload["type"] == "incident.firing"
    assert generic.payload["data"]["id"] == row.id
    assert "blocks" in chat.payload


def test_reminders_only_after_the_repeat_interval(session):
    rx = make_receiver(session, "am", repeat_interval_s=3600)
    never = make_receiver(session, "never", repeat_interval_s=0)
    row = make_incident(session)
    unnotified = make_incident(session, kind="hang", fingerprint="x:hang")
    assert remind_open(session=session, now=T0, public_url=URL) == []
    notify(session, opened=[row])
    assert remind_open(session=session, now=T0 + timedelta(minutes=59), public_url=URL) == []
    [again] = remind_open(session=session, now=T0 + timedelta(minutes=61), public_url=URL)
    assert (again.receiver_id, again.status, again.incident_id) == (rx.id, "firing", row.id)
    assert remind_open(session=session, now=T0 + timedelta(minutes=90), public_url=URL) == []
    [third] = remind_open(session=session, now=T0 + timedelta(minutes=122), public_url=URL)
    assert third.receiver_id != never.id
    assert unnotified.id not in {d.incident_id for d in sent(session)}
    resolve(session, row, T0 + timedelta(hours=3))
    assert remind_open(session=session, now=T0 + timedelta(hours=9), public_url=URL) == []


def test_reminders_stop_when_the_receiver_is_disabled_or_filtered(session):
    rx = make_receiver(session, "am", repeat_interval_s=60)
    row = make_incident(session)
    notify(session, opened=[row])
    update_receiver(session=session, receiver=rx, changes={"kinds": ["hang"]})
    assert remind_open(session=session, now=T0 + timedelta(hours=1), public_url=URL) == []
    update_receiver(session=session, receiver=rx, changes={"kinds": None, "enabled": False})
    assert remind_open(session=session, now=T0 + timedelta(hours=1), public_url=URL) == []


def test_test_delivery(session):
    rx = make_receiver(session, "am")
    delivery = create_test_delivery(session=session, receiver=rx, public_url=URL, now=T0)
    assert (delivery.status, delivery.incident_id, delivery.state) == ("test", None, "pending")
    assert delivery.payload["alerts"][0]["labels"]["alertname"] == "VigilTest"
    assert list_deliveries(session=session, receiver_id=rx.id) == [delivery]
