"""Actions: triggered over REST, delivered to ranks in ingest replies, reported back."""

from __future__ import annotations

import time

import pytest

from backend.auth.service import create_token
from tests.conftest import ADMIN, INGEST
from tests.factories import batch, step

JOB = "llama-8b-pretrain"


@pytest.fixture
def job(client):  # type: ignore[no-untyped-def]
    for rank in (0, 1):
        client.post(
            "/api/v1/ingest", json=batch([step(1)], rank=rank, world_size=2), headers=INGEST
        )
    return JOB


def trigger(client, **body):  # type: ignore[no-untyped-def]
    return client.post(
        f"/api/v1/jobs/{JOB}/actions", json={"kind": "dump_stacks", **body}, headers=ADMIN
    )


def ping(client, rank: int, events=()):  # type: ignore[no-untyped-def]
    reply = client.post(
        "/api/v1/ingest", json=batch(list(events), rank=rank, world_size=2), headers=INGEST
    )
    assert reply.status_code == 200, reply.text
    return reply.json()["actions"]


def report(action_id: int, state: str, **result):  # type: ignore[no-untyped-def]
    return {
        "type": "action",
        "id": action_id,
        "state": state,
        "ts": time.time(),
        "result": result or None,
    }


def test_trigger_dispatch_ack_succeed(client, job):
    created = trigger(client, reason="on-call wants stacks")
    assert created.status_code == 201, created.text
    action = created.json()
    assert (action["state"], action["requested_by"]) == ("pending", "api:bootstrap")

    first = ping(client, 0)
    assert first == [{"id": action["id"], "kind": "dump_stacks", "params": {}}]
    # Not yet acknowledged: the next reply carries it again (a reply may have been lost).
    assert ping(client, 0) == first
    assert ping(client, 0, [report(action["id"], "acked")]) == []
    state = client.get(f"/api/v1/actions/{action['id']}", headers=ADMIN).json()
    assert state["state"] == "acked"
    assert state["deliveries"]["0"]["state"] == "acked"

    ping(client, 0, [report(action["id"], "succeeded", threads=3)])
    assert client.get(f"/api/v1/actions/{action['id']}", headers=ADMIN).json()["state"] == "acked"
    assert ping(client, 1) != []  # rank 1 is targeted too (all ranks)
    ping(client, 1, [report(action["id"], "succeeded", threads=2)])
    done = client.get(f"/api/v1/actions/{action['id']}", headers=ADMIN).json()
    assert done["state"] == "succeeded"
    assert done["result"] == {"0": {"threads": 3}, "1": {"threads": 2}}


def test_targeted_action_reaches_only_its_ranks(client, job):
    action = trigger(client, target_ranks=[1]).json()
    assert ping(client, 0) == []
    assert [a["id"] for a in ping(client, 1)] == [action["id"]]


def test_one_failing_rank_fails_the_action(client, job):
    action = trigger(client).json()
    ping(client, 0, [report(action["id"], "failed", error="boom")])
    assert client.get(f"/api/v1/actions/{action['id']}", headers=ADMIN).json()["state"] == "failed"


def test_idempotency_key_returns_the_first_action(client, job):
    a = trigger(client, idempotency_key="incident-7-restart")
    b = trigger(client, idempotency_key="incident-7-restart")
    assert (a.status_code, b.status_code) == (201, 200)
    assert a.json()["id"] == b.json()["id"]
    assert len(client.get(f"/api/v1/jobs/{JOB}/actions", headers=ADMIN).json()) == 1


def test_undelivered_action_expires(client, job):
    action = trigger(client, ttl_s=0.001).json()
    time.sleep(0.01)
    assert ping(client, 0) == []
    assert client.get(f"/api/v1/actions/{action['id']}", headers=ADMIN).json()["state"] == (
        "expired"
    )


def test_triggering_needs_admin_and_valid_input(client, job, session):
    _, reader = create_token(session=session, name="viewer", scopes=["read"])
    session.commit()
    read = {"Authorization": f"Bearer {reader}"}
    assert (
        client.post(
            f"/api/v1/jobs/{JOB}/actions", json={"kind": "restart"}, headers=read
        ).status_code
        == 403
    )
    assert client.get(f"/api/v1/jobs/{JOB}/actions", headers=read).status_code == 200
    bad = client.post(f"/api/v1/jobs/{JOB}/actions", json={"kind": "Rm -rf"}, headers=ADMIN)
    assert bad.status_code == 422 and "kind" in bad.text
    missing = client.post("/api/v1/jobs/nope/actions", json={"kind": "restart"}, headers=ADMIN)
    assert missing.status_code == 404


def test_report_for_unknown_action_is_ignored_not_rejected(client, job):
    assert ping(client, 0, [report(99999, "succeeded")]) == []


def ping_attempt(client, rank: int, attempt: int, events=()):  # type: ignore[no-untyped-def]
    body = batch(list(events), rank=rank, world_size=2, attempt=attempt)
    reply = client.post("/api/v1/ingest", json=body, headers=INGEST)
    assert reply.status_code == 200, reply.text
    return reply.json()["actions"]


def test_a_restart_is_not_rerun_by_the_group_it_started(client, job):
    """Rank 0 ran the restart; rank 1 was torn down before it reported. The restarted
    group (attempt 1) must not receive it again: it would restart itself forever."""
    action = trigger(client, kind="restart").json()
    assert action["attempt"] == 0
    assert ping(client, 0) and ping(client, 1)  # both got it
    ping(client, 0, [report(action["id"], "succeeded", exit_code=75)])
    assert ping_attempt(client, 1, attempt=1) == []
    assert ping_attempt(client, 0, attempt=1) == []
    done = client.get(f"/api/v1/actions/{action['id']}", headers=ADMIN).json()
    assert done["state"] == "succeeded"  # the restart happened: that is its outcome
    assert done["result"]["superseded_by_attempt"] == 1


def test_other_actions_expire_when_the_job_restarts_before_they_ran(client, job):
    action = trigger(client).json()  # dump_stacks, for attempt 0
    assert ping_attempt(client, 0, attempt=1) == []
    done = client.get(f"/api/v1/actions/{action['id']}", headers=ADMIN).json()
    assert done["state"] == "expired" and "restarted" in done["result"]["note"]


def test_a_lagging_rank_of_an_earlier_attempt_does_not_get_a_new_action(client, job):
    ping_attempt(client, 0, attempt=1)  # the job is at attempt 1 now
    action = trigger(client).json()
    assert action["attempt"] == 1
    assert ping_attempt(client, 1, attempt=0) == []  # an old process still flushing
    assert [a["id"] for a in ping_attempt(client, 1, attempt=1)] == [action["id"]]
