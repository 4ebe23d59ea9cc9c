"""The audit trail: appending, listing (newest first, filtered), and its REST routes."""

from __future__ import annotations

from datetime import timedelta

from backend.audit.service import audit, list_audit
from backend.auth.service import create_token
from backend.db import utcnow
from backend.jobs.models import Job
from tests.conftest import ADMIN

JOB = "llama-8b-pretrain"


def make_job(session, name: str = JOB) -> Job:  # type: ignore[no-untyped-def]
    job = Job(name=name, world_size=2)
    session.add(job)
    session.flush()
    return job


def test_audit_appends_and_cuts_to_column_widths(session):
    job = make_job(session)
    entry = audit(session=session, job_id=job.id, actor="a" * 300, event="e" * 40)
    assert entry.id is not None
    assert (len(entry.actor), len(entry.event), entry.detail) == (128, 32, {})


def test_list_audit_is_newest_first_and_filters(session):
    job, other = make_job(session), make_job(session, "other")
    t0 = utcnow()
    audit(session=session, job_id=job.id, actor="policy", event="skipped", at=t0, incident_id=None)
    audit(session=session, job_id=job.id, actor="api:x", event="policy_set", at=t0)  # same time
    audit(session=session, job_id=other.id, actor="policy", event="no_action", at=t0)
    audit(session=session, job_id=None, actor="api:x", event="policy_set", detail={"kind": "*"})
    late = audit(
        session=session, job_id=job.id, actor="rank:0", event="acked",
        at=t0 + timedelta(seconds=1), detail={"rank_state": "acked"},
    )  # fmt: skip
    events = [(e.actor, e.event) for e in list_audit(session=session, job_id=job.id)]
    assert events == [("rank:0", "acked"), ("api:x", "policy_set"), ("policy", "skipped")]
    assert list_audit(session=session, job_id=job.id, limit=1) == [late]
    assert [e.detail for e in list_audit(session=session, job_id=None)] == [{"kind": "*"}]
    assert list_audit(session=session, job_id=job.id, action_id=1) == []
    assert list_audit(session=session, job_id=job.id, incident_id=1) == []


def test_job_audit_route_keeps_its_path_and_shape(client, session):
    job = make_job(session)
    audit(session=session, job_id=job.id, actor="policy", event="skipped", detail={"r": 1})
    session.commit()
    reply = client.get(f"/api/v1/jobs/{JOB}/audit", headers=ADMIN)
    assert reply.status_code == 200, reply.text
    [entry] = reply.json()
    assert set(entry) == {"id", "job", "action_id", "incident_id", "at", "actor", "event", "detail"}
    assert (entry["job"], entry["actor"], entry["event"], entry["detail"]) == (
        JOB,
        "policy",
        "skipped",
        {"r": 1},
    )
    assert client.get("/api/v1/jobs/nope/audit", headers=ADMIN).status_code == 404
    assert client.get(f"/api/v1/jobs/{JOB}/audit?limit=0", headers=ADMIN).status_code == 422


def test_audit_routes_need_a_read_token(client, session):
    make_job(session)
    _, token = create_token(session=session, name="ingest-only", scopes=["ingest"])
    session.commit()
    ingest = {"Authorization": f"Bearer {token}"}
    assert client.get(f"/api/v1/jobs/{JOB}/audit", headers=ingest).status_code == 403
    assert client.get("/api/v1/audit", headers=ingest).status_code == 403
    assert client.get("/api/v1/audit").status_code == 401
