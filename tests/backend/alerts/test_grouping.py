"""Grouping: a job's burst of incidents is one notification (Alertmanager's group_by and
group_wait), sent to a real local HTTP receiver; resolved ones likewise; formats and
signatures still hold."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from sqlalchemy import func, select

from backend.alerts import formats
from backend.alerts.grouping import MAX_GROUP
from backend.alerts.models import DeliveryIncident, WebhookDelivery
from backend.alerts.sender import send_due
from backend.alerts.service import notify_changes
from backend.incidents.follow_up import follow_up
from backend.incidents.models import Incident
from backend.incidents.service import apply_findings
from detectors.finding import Finding
from tests.backend.alerts.conftest import T0, make_incident, make_job, make_receiver, resolve

URL = "https://vigil.example"
BURST = ("straggler", "nan", "loss_spike", "comm_anomaly", "memory_pressure")
WINDOW_KINDS = set(BURST)  # what the detection runs cover


def notify(session, opened=(), resolved=(), now=T0):  # type: ignore[no-untyped-def]
    return notify_changes(
        session=session, opened=list(opened), resolved=list(resolved), now=now, public_url=URL
    )


def incidents_of(session, delivery) -> list[int]:  # type: ignore[no-untyped-def]
    query = select(DeliveryIncident.incident_id).where(DeliveryIncident.delivery_id == delivery.id)
    return sorted(session.scalars(query))


def deliveries(session) -> list[WebhookDelivery]:  # type: ignore[no-untyped-def]
    return list(session.scalars(select(WebhookDelivery).order_by(WebhookDelivery.id)))


def finding(kind: str, rank: int) -> Finding:
    return Finding(
        kind=kind,
        severity="warning",
        ranks=(rank,),
        first_step=100,
        score=3.0,
        summary=f"{kind} on rank {rank}",
        key=f"{kind}:{rank}",
        evidence={},
        last_step=150,
    )


def test_a_burst_of_five_incidents_across_detection_runs_is_one_notification(
    session, session_factory, settings, receiver_server
):
    """Five incidents of one job, opened by five detection runs a second apart, reach a
    real receiver as one Alertmanager notification with five alerts, after group_wait."""
    make_receiver(session, "am", url=receiver_server.url, group_wait_s=30)
    job = make_job(session, "burst-job")
    found: list[Finding] = []
    for n, kind in enumerate(BURST):
        found.append(finding(kind, n))
        changes = apply_findings(
            session=session, job_id=job.id, findings=found, covered_kinds=WINDOW_KINDS
        )
        follow_up(session=session, changes=changes, settings=settings)
        session.commit()
    [delivery] = deliveries(session)
    assert len(incidents_of(session, delivery)) == 5
    fast = settings.model_copy(update={"webhook_timeout_s": 2.0})
    # Nothing goes out before the group's wait is over; then exactly one request.
    assert send_due(session_factory, settings=fast, now=datetime.now(UTC)) == 0
    later = datetime.now(UTC) + timedelta(seconds=31)
    assert send_due(session_factory, settings=fast, now=later) == 1
    [request] = receiver_server.requests
    body = json.loads(request.body)
    assert body["status"] == "firing" and body["groupLabels"] == {"job": "burst-job"}
    assert body["groupKey"] == '{}:{job="burst-job"}'
    assert sorted(a["labels"]["kind"] for a in body["alerts"]) == sorted(BURST)
    assert body["commonLabels"]["job"] == "burst-job" and "kind" not in body["commonLabels"]

    # The five clear in one run: one resolved notification names them all.
    changes = apply_findings(
        session=session, job_id=job.id, findings=[], covered_kinds=WINDOW_KINDS
    )
    assert len(changes.resolved) == 5
    follow_up(session=session, changes=changes, settings=settings)
    session.commit()
    assert send_due(session_factory, settings=fast, now=later + timedelta(seconds=31)) == 1
    resolved = json.loads(receiver_server.requests[-1].body)
    assert resolved["status"] == "resolved" and len(resolved["alerts"]) == 5
    assert len(receiver_server.requests) == 2


def test_incidents_join_the_group_only_while_it_waits(session):
    make_receiver(session, "am", group_wait_s=10)
    first = notify(session, opened=[make_incident(session, kind="nan")], now=T0)
    joined = notify(
        session, opened=[make_incident(session, kind="hang")], now=T0 + timedelta(seconds=9)
    )
    assert [d.id for d in joined] == [d.id for d in first]
    assert first[0].next_attempt_at == T0 + timedelta(seconds=10)  # not pushed back
    late = notify(
        session, opened=[make_incident(session, kind="crash")], now=T0 + timedelta(seconds=10)
    )
    assert late[0].id != first[0].id
    assert len(first[0].payload["alerts"]) == 2 and len(late[0].payload["alerts"]) == 1


def test_group_wait_zero_sends_each_change_at_once(session):
    make_receiver(session, "am", group_wait_s=0)
    a = notify(session, opened=[make_incident(session, kind="nan")], now=T0)
    b = notify(session, opened=[make_incident(session, kind="hang")], now=T0)
    assert a[0].id != b[0].id and a[0].next_attempt_at == T0
    # Incidents changed together are still one notification.
    both = notify(
        session,
        opened=[make_incident(session, kind="crash"), make_incident(session, kind="slowdown")],
    )
    assert len(both) == 1 and len(both[0].payload["alerts"]) == 2


def test_group_by_is_per_receiver(session):
    by_kind = make_receiver(session, "by-kind", group_by=["job", "kind"])
    each = make_receiver(session, "each", group_by=["incident_id"])
    everything = make_receiver(session, "everything", group_by=[])
    rows = [
        make_incident(session, kind="nan", fingerprint="a"),
        make_incident(session, kind="nan", fingerprint="b"),
        make_incident(session, job="other", kind="hang"),
    ]
    made = notify(session, opened=rows)
    count = {r.id: sum(d.receiver_id == r.id for d in made) for r in (by_kind, each, everything)}
    assert count == {by_kind.id: 2, each.id: 3, everything.id: 1}
    [all_in_one] = [d for d in made if d.receiver_id == everything.id]
    assert all_in_one.payload["groupLabels"] == {} and len(all_in_one.payload["alerts"]) == 3


def test_generic_format_is_one_event_per_incident_unless_grouped(session, receiver_server):
    default = make_receiver(session, "hook", format="generic", group_wait_s=30)
    grouped = make_receiver(session, "grouped", format="generic", group_by=["job"])
    rows = [make_incident(session, kind="nan"), make_incident(session, kind="hang")]
    made = notify(session, opened=rows)
    mine = [d for d in made if d.receiver_id == default.id]
    assert [d.payload["type"] for d in mine] == ["incident.firing", "incident.firing"]
    assert all(d.next_attempt_at == T0 for d in mine)  # nothing to wait for: no group wait
    [group] = [d for d in made if d.receiver_id == grouped.id]
    assert group.payload["type"] == "incidents.firing"
    assert group.payload["data"]["group"] == {"job": "llama-8b"}
    assert [i["id"] for i in group.payload["data"]["incidents"]] == sorted(r.id for r in rows)


def test_grouped_generic_payload_is_signed_as_sent(
    session, session_factory, settings, receiver_server
):
    rx = make_receiver(
        session, "grouped", format="generic", group_by=["job"], url=receiver_server.url
    )
    secret = rx.secret
    notify(
        session, opened=[make_incident(session, kind="nan"), make_incident(session, kind="hang")]
    )
    session.commit()
    assert send_due(session_factory, settings=settings, now=T0) == 1
    [request] = receiver_server.requests
    h = request.headers
    assert formats.verify(
        secret,
        h["webhook-id"],
        h["webhook-timestamp"],
        request.body,
        h["webhook-signature"],
        now=int(h["webhook-timestamp"]),
    )
    assert json.loads(request.body)["type"] == "incidents.firing"


def test_slack_group_lists_the_incidents(session):
    make_receiver(session, "chat", format="slack", url="https://hooks.slack.com/services/T/B/X")
    rows = [make_incident(session, kind=k, fingerprint=k) for k in ("nan", "hang", "crash")]
    [chat] = notify(session, opened=rows)
    text = json.dumps(chat.payload)
    assert "3 incidents" in chat.payload["text"] and all(f"#{r.id}" in text for r in rows)


def test_a_group_holds_at_most_max_group_incidents(session):
    make_receiver(session, "am")
    rows = [make_incident(session, fingerprint=f"fp{n}") for n in range(MAX_GROUP + 1)]
    made = notify(session, opened=rows)
    assert sorted(len(d.payload["alerts"]) for d in made) == [1, MAX_GROUP]


def test_resolved_and_fired_again_within_the_wait_ends_on_firing(session):
    """Firing (waiting), resolved, then firing again before the first group went out: the
    receiver's last word on the incident must be "firing"."""
    make_receiver(session, "am", group_wait_s=30)
    row = make_incident(session)
    [fired] = notify(session, opened=[row], now=T0)
    resolve(session, row, T0 + timedelta(seconds=5))
    [ended] = notify(session, resolved=[row], now=T0 + timedelta(seconds=5))
    row.status, row.resolved_at = "open", None
    [again] = notify(session, opened=[row], now=T0 + timedelta(seconds=8))
    assert len({fired.id, ended.id, again.id}) == 3
    assert fired.next_attempt_at < ended.next_attempt_at < again.next_attempt_at
    assert again.status == "firing"


def test_a_claimed_group_is_frozen(session, session_factory, settings, receiver_server):
    make_receiver(session, "am", url=receiver_server.url, group_wait_s=0)
    [sent] = notify(session, opened=[make_incident(session, kind="nan")])
    session.commit()
    assert send_due(session_factory, settings=settings, now=T0) == 1
    [later] = notify(session, opened=[make_incident(session, kind="hang")])
    assert later.id != sent.id
    total = session.scalar(select(func.count()).select_from(Incident))
    assert total == 2 and len(json.loads(receiver_server.requests[0].body)["alerts"]) == 1
