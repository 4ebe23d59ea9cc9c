"""Serving detection over stored data: a burning SLO becomes an ``slo_burn`` incident that
follows its tier and resolves when the short windows recover, evaluated from the minute
rollups kept at ingest."""

from __future__ import annotations

import time

from sqlalchemy import select

from backend.detection.runner import detect_job, sweep_job
from backend.jobs.models import Job
from tests.conftest import ADMIN, INGEST
from tests.factories import batch

JOB = "chat"


def requests(n: int, *, start: float, every: float, ttft: float, replica: str = "r0"):  # type: ignore[no-untyped-def]
    return [
        {
            "type": "request",
            "id": f"{replica}-{start}-{i}",
            "arrival": start + i * every,
            "first_token": start + i * every + ttft,
            "end": start + i * every + ttft + 0.5,
            "output_tokens": 11,
            "replica": replica,
        }
        for i in range(n)
    ]


def setup(client, now: float) -> int:  # type: ignore[no-untyped-def]
    reply = client.post(
        "/api/v1/slos", json={"job": JOB, "name": "ttft", "ttft_s": 0.5}, headers=ADMIN
    )
    assert reply.status_code == 201, reply.text
    # An hour of good traffic, then five minutes in which every request is slow.
    events = requests(360, start=now - 3900, every=10, ttft=0.1)
    events += requests(60, start=now - 300, every=5, ttft=2.0)
    reply = client.post(
        "/api/v1/ingest", json=batch(events, job=JOB, kind="serving"), headers=INGEST
    )
    assert reply.status_code == 200, reply.text
    return int(reply.json()["accepted"])


def job_id(session) -> int:  # type: ignore[no-untyped-def]
    return int(session.scalar(select(Job.id).where(Job.name == JOB)))


def incidents(client, kind: str = "slo_burn"):  # type: ignore[no-untyped-def]
    found = client.get(f"/api/v1/jobs/{JOB}/incidents", headers=ADMIN).json()
    return [i for i in found if i["kind"] == kind]


def test_a_burning_slo_pages_and_resolves_when_the_short_windows_recover(client, session):
    now = time.time()
    setup(client, now)
    changes = detect_job(session=session, job_id=job_id(session), now=now)
    session.commit()
    [incident] = incidents(client)
    assert (incident["kind"], incident["severity"], incident["status"]) == (
        "slo_burn",
        "critical",
        "open",
    )
    assert "ttft" in incident["summary"]
    # The TTFT jump also reads as a queue building up (no queue_s reported: TTFT stands in).
    assert {row.kind for row in changes.opened} <= {"slo_burn", "queue_buildup"}
    assert "slo_burn" in {row.kind for row in changes.opened}
    # No traffic since: once every tier's short window has no bad request left (the
    # ticket tier's is the longest, ~6 h for a 28-day SLO) the sweep resolves it.
    sweep_job(session=session, job_id=job_id(session), now=now + 7 * 3600)
    session.commit()
    [incident] = incidents(client)
    assert incident["status"] == "resolved"


def test_good_traffic_opens_nothing(client, session):
    now = time.time()
    client.post("/api/v1/slos", json={"job": JOB, "name": "ttft", "ttft_s": 0.5}, headers=ADMIN)
    events = requests(360, start=now - 3600, every=10, ttft=0.1)
    client.post("/api/v1/ingest", json=batch(events, job=JOB, kind="serving"), headers=INGEST)
    assert not detect_job(session=session, job_id=job_id(session), now=now)
    assert client.get(f"/api/v1/jobs/{JOB}/incidents", headers=ADMIN).json() == []
