"""People handle incidents: acknowledge (who, when; reminders stop), resolve by hand with a
note (audited, notified, not re-opened by detection for the same episode), open for how
long — over REST with an admin token (issue 17, "Alerts cannot be handled")."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import select

from backend.actions.models import Action
from backend.alerts.models import WebhookDelivery
from backend.alerts.service import remind_open
from backend.audit.models import AuditEntry
from backend.auth.service import create_token
from backend.db import utcnow
from backend.incidents.follow_up import follow_up
from backend.incidents.models import Incident
from backend.incidents.service import apply_findings
from detectors.finding import Finding
from tests.conftest import ADMIN, INGEST
from tests.factories import batch, step

JOB = "llama-8b-pretrain"
KINDS = {"straggler", "slowdown", "comm_anomaly", "hang"}
URL = "https://vigil.example"


def straggler(first: int = 60, last: int = 120, *, active: bool = True) -> Finding:
    return Finding(
        kind="straggler",
        severity="critical",
        ranks=(2,),
        first_step=first,
        score=9.0,
        summary=f"rank 2 computes 1.6x slower than the median rank since step {first}",
        key="straggler:2",
        evidence={"ratio": 1.6},
        last_step=last,
        active=active,
    )


def hang() -> Finding:
    return Finding(
        kind="hang",
        severity="critical",
        ranks=(1,),
        first_step=None,
        score=1.0,
        summary="rank 1 never entered all_reduce seq 40",
        key="hang:dp",
    )


def run(session, settings, job_id, findings):  # type: ignore[no-untyped-def]
    """One detection run, in a fresh view of the database (as a worker's session is)."""
    session.expire_all()
    changes = apply_findings(session=session, job_id=job_id, findings=findings, covered_kinds=KINDS)
    follow_up(session=session, changes=changes, settings=settings)
    session.commit()
    return changes


def incidents(session, job_id) -> list[Incident]:  # type: ignore[no-untyped-def]
    session.expire_all()
    query = select(Incident).where(Incident.job_id == job_id).order_by(Incident.id)
    return list(session.scalars(query))


def events(session, incident_id) -> list[AuditEntry]:  # type: ignore[no-untyped-def]
    query = select(AuditEntry).where(AuditEntry.incident_id == incident_id)
    return list(session.scalars(query.order_by(AuditEntry.id)))


def job_with_receiver(client, session) -> int:  # type: ignore[no-untyped-def]
    from backend.jobs.models import Job

    client.post("/api/v1/ingest", json=batch([step(1)]), headers=INGEST)
    made = client.post(
        "/api/v1/webhooks",
        json={"name": "oncall", "url": "http://127.0.0.1:9/hook", "group_wait_s": 0,
              "repeat_interval_s": 60},
        headers=ADMIN,
    )  # fmt: skip
    assert made.status_code == 201, made.text
    return int(session.scalar(select(Job.id).where(Job.name == JOB)))


def test_acknowledge_keeps_who_and_when_and_is_audited(client, session, settings):
    job_id = job_with_receiver(client, session)
    [row] = run(session, settings, job_id, [straggler()]).opened
    reply = client.post(f"/api/v1/incidents/{row.id}/ack", headers=ADMIN)
    assert reply.status_code == 200, reply.text
    out = reply.json()
    assert out["status"] == "open" and out["acked_by"].startswith("api:") and out["acked_at"]
    again = client.post(f"/api/v1/incidents/{row.id}/ack", headers=ADMIN).json()
    assert again["acked_at"] == out["acked_at"]  # again: unchanged
    assert [e.event for e in events(session, row.id) if "ack" in e.event] == ["acknowledged"]
    back = client.delete(f"/api/v1/incidents/{row.id}/ack", headers=ADMIN).json()
    assert back["acked_at"] is None and back["acked_by"] is None
    assert [e.event for e in events(session, row.id) if "ack" in e.event] == [
        "acknowledged",
        "unacknowledged",
    ]


def test_acknowledged_incidents_get_no_reminders(client, session, settings):
    job_id = job_with_receiver(client, session)
    [row] = run(session, settings, job_id, [straggler()]).opened
    client.post(f"/api/v1/incidents/{row.id}/ack", headers=ADMIN)
    later = utcnow() + timedelta(hours=2)
    assert remind_open(session=session, now=later, public_url=URL) == []
    client.delete(f"/api/v1/incidents/{row.id}/ack", headers=ADMIN)
    session.expire_all()
    [reminder] = remind_open(session=session, now=later, public_url=URL)
    assert reminder.incident_id == row.id


def test_acknowledge_and_resolve_refuse_what_the_state_does_not_allow(client, session, settings):
    job_id = job_with_receiver(client, session)
    [row] = run(session, settings, job_id, [straggler()]).opened
    _, read = create_token(session=session, name="viewer", scopes=["read"])
    session.commit()
    reader = {"Authorization": f"Bearer {read}"}
    assert client.post(f"/api/v1/incidents/{row.id}/ack", headers=reader).status_code == 403
    assert client.post("/api/v1/incidents/99999/ack", headers=ADMIN).status_code == 404
    empty = client.post(f"/api/v1/incidents/{row.id}/resolve", json={"note": ""}, headers=ADMIN)
    assert empty.status_code == 422 and empty.json()["detail"][0]["field"] == "note"
    blank = client.post(f"/api/v1/incidents/{row.id}/resolve", json={"note": "  "}, headers=ADMIN)
    assert blank.status_code == 422 and "note" in blank.json()["detail"]
    assert client.get(f"/api/v1/incidents/{row.id}", headers=ADMIN).json()["status"] == "open"
    ok = client.post(f"/api/v1/incidents/{row.id}/resolve", json={"note": "done"}, headers=ADMIN)
    assert ok.status_code == 200
    twice = client.post(f"/api/v1/incidents/{row.id}/resolve", json={"note": "x"}, headers=ADMIN)
    assert twice.status_code == 409 and "resolved already" in twice.json()["detail"]
    ack = client.post(f"/api/v1/incidents/{row.id}/ack", headers=ADMIN)
    assert ack.status_code == 409 and "nothing to acknowledge" in ack.json()["detail"]


def test_resolve_by_hand_closes_notifies_audits_and_withdraws_the_proposal(
    client, session, settings
):
    job_id = job_with_receiver(client, session)
    [row] = run(session, settings, job_id, [straggler()]).opened
    [action] = session.scalars(select(Action).where(Action.incident_id == row.id))
    assert action.state == "proposed"
    note = "rank 2's node drained and replaced"
    reply = client.post(f"/api/v1/incidents/{row.id}/resolve", json={"note": note}, headers=ADMIN)
    out = reply.json()
    assert (out["status"], out["resolution_note"]) == ("resolved", note)
    assert out["resolved_by"].startswith("api:") and out["resolved_at"]
    assert out["open_for_s"] >= 0
    entry = next(e for e in events(session, row.id) if e.event == "resolved")
    assert entry.detail == {"note": note} and entry.actor == out["resolved_by"]
    session.expire_all()
    assert session.get(Action, action.id).state == "cancelled"
    statuses = session.scalars(
        select(WebhookDelivery.status).where(WebhookDelivery.incident_id == row.id)
    ).all()
    assert sorted(statuses) == ["firing", "resolved"]


def test_detection_does_not_reopen_the_same_episode_a_person_resolved(client, session, settings):
    job_id = job_with_receiver(client, session)
    [row] = run(session, settings, job_id, [straggler(60, 120)]).opened
    client.post(f"/api/v1/incidents/{row.id}/resolve", json={"note": "known"}, headers=ADMIN)
    # The detector still reports the episode (same onset, the window moved on): ignored.
    for last in (140, 160):
        changes = run(session, settings, job_id, [straggler(60, last)])
        assert not (changes.opened or changes.reopened)
    [only] = incidents(session, job_id)
    assert only.status == "resolved" and only.held and only.resolved_by
    # A genuinely new episode (onset after what the incident knew) is a new incident.
    [new] = run(session, settings, job_id, [straggler(300, 340)]).opened
    assert new.id != row.id
    old, _ = incidents(session, job_id)
    assert not old.held and old.status == "resolved"


def test_once_the_condition_clears_a_return_is_a_new_incident(client, session, settings):
    job_id = job_with_receiver(client, session)
    [row] = run(session, settings, job_id, [straggler(60, 120)]).opened
    client.post(f"/api/v1/incidents/{row.id}/resolve", json={"note": "known"}, headers=ADMIN)
    run(session, settings, job_id, [])  # the detector no longer reports it: hold ends
    assert not incidents(session, job_id)[0].held
    # Same onset again (a detector re-reporting the old episode): still not re-opened;
    # a new incident tells people it is back.
    changes = run(session, settings, job_id, [straggler(60, 200)])
    assert not changes.reopened and [r.id for r in changes.opened] != [row.id]
    assert incidents(session, job_id)[0].status == "resolved"


def test_a_finding_without_steps_stays_held_until_it_clears(client, session, settings):
    job_id = job_with_receiver(client, session)
    [row] = run(session, settings, job_id, [hang()]).opened
    client.post(f"/api/v1/incidents/{row.id}/resolve", json={"note": "restarted"}, headers=ADMIN)
    assert not run(session, settings, job_id, [hang()]).opened
    run(session, settings, job_id, [])
    [again] = run(session, settings, job_id, [hang()]).opened
    assert again.id != row.id


def test_open_for_counts_until_now_or_until_resolved(client, session, settings):
    job_id = job_with_receiver(client, session)
    [row] = run(session, settings, job_id, [straggler()]).opened
    row.detected_at = utcnow() - timedelta(hours=2)
    session.commit()
    open_for = client.get(f"/api/v1/incidents/{row.id}", headers=ADMIN).json()["open_for_s"]
    assert 7190 <= open_for <= 7300
    client.post(f"/api/v1/incidents/{row.id}/resolve", json={"note": "ok"}, headers=ADMIN)
    [listed] = client.get(f"/api/v1/jobs/{JOB}/incidents", headers=ADMIN).json()
    frozen = listed["open_for_s"]
    assert 7190 <= frozen <= 7300
