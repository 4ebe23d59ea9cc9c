"""Recovery over REST: approve, cancel, policies, audit."""

from __future__ import annotations

import pytest

from backend.auth.service import create_token
from backend.jobs.models import Job
from backend.recovery import service
from backend.recovery.views import router
from tests.backend.recovery.helpers import make_incident, make_job
from tests.conftest import ADMIN

JOB = "llama-8b-pretrain"


@pytest.fixture
def app(app):  # type: ignore[no-untyped-def]
    # The lead mounts the router in backend/api.py; until then, mount it here.
    if not any(getattr(r, "path", "").startswith("/api/v1/policies") for r in app.routes):
        app.include_router(router)
    return app


@pytest.fixture
def reader(session):  # type: ignore[no-untyped-def]
    _, token = create_token(session=session, name="viewer", scopes=["read"])
    session.commit()
    return {"Authorization": f"Bearer {token}"}


def propose(session, settings, kind="hang", count=1):  # type: ignore[no-untyped-def]
    """A job with ``count`` proposed actions (the built-in policy is `approve`)."""
    job = session.query(Job).filter_by(name=JOB).one_or_none() or make_job(session)
    incidents = [make_incident(session, job, kind) for _ in range(count)]
    actions = service.respond(session=session, incidents=incidents, settings=settings)
    session.commit()
    return actions


def url(action_id: int, verb: str, job: str = JOB) -> str:
    return f"/api/v1/jobs/{job}/actions/{action_id}/{verb}"


def test_approve_releases_a_proposed_action(client, session, settings):
    [action] = propose(session, settings)
    reply = client.post(url(action.id, "approve"), headers=ADMIN)
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert (body["state"], body["approved_by"]) == ("pending", "api:bootstrap")
    assert body["reasoning"]["chosen"] == "restart"
    assert body["reasoning"]["approval"]["by"] == "api:bootstrap"
    again = client.post(url(action.id, "approve"), headers=ADMIN)
    assert again.status_code == 409
    assert "is pending: only a proposed action can be approved" in again.json()["detail"]
    shown = client.get(f"/api/v1/actions/{action.id}", headers=ADMIN).json()
    assert shown["approved_by"] == "api:bootstrap" and shown["reasoning"]["candidates"]


def test_cancel_and_conflicts(client, session, settings):
    [action] = propose(session, settings)
    reply = client.post(url(action.id, "cancel"), json={"note": "false alarm"}, headers=ADMIN)
    assert reply.status_code == 200 and reply.json()["state"] == "cancelled"
    again = client.post(url(action.id, "cancel"), headers=ADMIN)
    assert again.status_code == 409 and "cancelled already" in again.json()["detail"]
    assert client.post(url(action.id, "approve"), headers=ADMIN).status_code == 409


def test_missing_job_or_action_is_404(client, session, settings):
    [action] = propose(session, settings)
    missing = client.post(url(99999, "approve"), headers=ADMIN)
    assert missing.status_code == 404 and "action 99999 not found" in missing.json()["detail"]
    other = make_job(session, "other")
    session.commit()
    wrong_job = client.post(url(action.id, "cancel", job=other.name), headers=ADMIN)
    assert wrong_job.status_code == 404 and "'other'" in wrong_job.json()["detail"]
    no_job = client.post(url(action.id, "approve", job="nope"), headers=ADMIN)
    assert no_job.status_code == 404 and "job 'nope' not found" in no_job.json()["detail"]


def test_guard_block_is_409_and_audited_then_force(client, session, settings):
    first, second = propose(session, settings, count=2)
    assert client.post(url(first.id, "approve"), headers=ADMIN).status_code == 200
    blocked = client.post(url(second.id, "approve"), headers=ADMIN)
    assert blocked.status_code == 409
    assert "cooldown" in blocked.json()["detail"]
    assert {g["guard"]: g["ok"] for g in blocked.json()["guards"]}["cooldown"] is False
    audit = client.get(f"/api/v1/jobs/{JOB}/audit", headers=ADMIN).json()
    assert (audit[0]["event"], audit[0]["action_id"]) == ("blocked", second.id)
    forced = client.post(url(second.id, "approve"), json={"force": True}, headers=ADMIN)
    assert forced.status_code == 200 and forced.json()["reasoning"]["approval"]["forced"]


def test_approve_and_cancel_need_admin(client, session, settings, reader):
    [action] = propose(session, settings)
    assert client.post(url(action.id, "approve"), headers=reader).status_code == 403
    assert client.post(url(action.id, "cancel"), headers=reader).status_code == 403


def test_policies_put_and_get(client, reader):
    # The job need not exist yet.
    reply = client.put(
        "/api/v1/jobs/future-job/policies/straggler",
        json={"mode": "auto", "actions": ["evict_rank"], "params": {"allow_evict": True}},
        headers=ADMIN,
    )
    assert reply.status_code == 200, reply.text
    assert reply.json()["params"] == {"allow_evict": True}
    client.put("/api/v1/jobs/future-job/policies/*", json={"mode": "off"}, headers=ADMIN)
    listed = client.get("/api/v1/jobs/future-job/policies", headers=reader).json()
    assert [(p["kind"], p["mode"], p["updated_by"]) for p in listed] == [
        ("*", "off", "api:bootstrap"),
        ("straggler", "auto", "api:bootstrap"),
    ]
    assert client.put("/api/v1/policies/hang", json={"mode": "auto"}, headers=ADMIN).is_success
    defaults = client.get("/api/v1/policies", headers=reader).json()
    assert [(p["job"], p["kind"]) for p in defaults] == [("*", "hang")]
    global_audit = client.get("/api/v1/audit", headers=reader).json()
    assert {e["detail"]["kind"] for e in global_audit} == {"straggler", "*", "hang"}
    assert (
        client.put("/api/v1/policies/hang", json={"mode": "off"}, headers=reader).status_code == 403
    )


@pytest.mark.parametrize(
    ("path", "body", "names"),
    [
        ("/api/v1/jobs/j/policies/meltdown", {"mode": "auto"}, "unknown incident kind"),
        ("/api/v1/policies/meltdown", {"mode": "auto"}, "kind"),
        ("/api/v1/jobs/j/policies/hang", {"mode": "sometimes"}, "mode"),
        ("/api/v1/jobs/j/policies/hang", {"mode": "auto", "actions": ["reboot"]}, "actions"),
        ("/api/v1/jobs/j/policies/hang", {"mode": "auto", "params": {"horizon_s": 0}}, "horizon_s"),
        ("/api/v1/jobs/j/policies/hang", {"mode": "auto", "params": {"colour": 1}}, "colour"),
        ("/api/v1/jobs/*/policies/hang", {"mode": "auto"}, "/api/v1/policies"),
    ],
)
def test_bad_policies_are_422_naming_the_field(client, path, body, names):
    reply = client.put(path, json=body, headers=ADMIN)
    assert reply.status_code == 422, reply.text
    assert names in reply.text


def test_audit_listing(client, session, settings, reader):
    [action] = propose(session, settings)
    client.post(url(action.id, "approve"), headers=ADMIN)
    audit = client.get(f"/api/v1/jobs/{JOB}/audit", headers=reader)
    assert audit.status_code == 200
    assert [(e["actor"], e["event"]) for e in audit.json()] == [
        ("api:bootstrap", "approved"),
        ("policy", "proposed"),
    ]
    assert all(e["job"] == JOB and e["action_id"] == action.id for e in audit.json())
    only = client.get(f"/api/v1/jobs/{JOB}/audit?action_id=99999", headers=reader).json()
    assert only == []
    assert client.get("/api/v1/jobs/nope/audit", headers=reader).status_code == 404


def test_manual_trigger_is_audited(client, session):
    make_job(session)
    session.commit()
    reply = client.post(f"/api/v1/jobs/{JOB}/actions", json={"kind": "restart"}, headers=ADMIN)
    assert reply.status_code == 201
    [entry] = client.get(f"/api/v1/jobs/{JOB}/audit", headers=ADMIN).json()
    assert (entry["actor"], entry["event"], entry["detail"]["kind"]) == (
        "api:bootstrap",
        "created",
        "restart",
    )
