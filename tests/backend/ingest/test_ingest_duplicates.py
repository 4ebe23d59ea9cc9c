"""A retried ``batch_id`` is stored once; the same id with other content is a 409, not a
silent drop; ``batch_id`` is unique per job, not across jobs (issue 13, item 7)."""

from __future__ import annotations

import gzip
import json

from sqlalchemy import func, select

from backend.ingest.models import IngestBatch
from backend.jobs.models import Job
from backend.telemetry.models import StepRecord
from tests.conftest import INGEST
from tests.factories import batch, step


def count(session, model) -> int:  # type: ignore[no-untyped-def]
    return int(session.scalar(select(func.count()).select_from(model)))


def test_same_batch_id_with_other_content_is_a_409_naming_it(client, session):
    first = batch([step(1), step(2)])
    assert client.post("/api/v1/ingest", json=first, headers=INGEST).status_code == 200
    changed = {**first, "events": [step(1), step(3)]}
    reply = client.post("/api/v1/ingest", json=changed, headers=INGEST)
    assert reply.status_code == 409, reply.text
    assert reply.json()["error"] == "batch_id_reused"
    assert reply.json()["batch_id"] == first["batch_id"]
    assert first["batch_id"] in reply.json()["detail"]
    assert "different content" in reply.json()["detail"]
    assert sorted(session.scalars(select(StepRecord.step))) == [1, 2]


def test_identical_retry_is_a_duplicate_gzipped_or_not(client, session):
    """The hash is over the decompressed body: a retry compressed differently matches."""
    body = batch([step(1)])
    raw = json.dumps(body).encode()
    assert client.post("/api/v1/ingest", content=raw, headers=INGEST).json()["duplicate"] is False
    again = client.post(
        "/api/v1/ingest",
        content=gzip.compress(raw, compresslevel=9),
        headers={**INGEST, "Content-Type": "application/json", "Content-Encoding": "gzip"},
    )
    assert again.status_code == 200, again.text
    assert again.json() == {"accepted": 1, "duplicate": True, "actions": []}
    assert count(session, StepRecord) == 1


def test_batch_id_is_scoped_to_the_job(client, session):
    """The same id under another job is that job's batch: stored, not dropped as a
    duplicate (which used to create the other job empty and drop its data)."""
    first = batch([step(1)], job="job-a")
    client.post("/api/v1/ingest", json=first, headers=INGEST)
    other = {**first, "job": "job-b"}
    reply = client.post("/api/v1/ingest", json=other, headers=INGEST)
    assert reply.status_code == 200, reply.text
    assert reply.json()["duplicate"] is False
    job_b = session.scalar(select(Job.id).where(Job.name == "job-b"))
    assert session.scalar(select(func.count()).where(StepRecord.job_id == job_b)) == 1
    assert count(session, IngestBatch) == 2


def test_a_refused_retry_creates_nothing(client, session):
    first = batch([step(1)])
    client.post("/api/v1/ingest", json=first, headers=INGEST)
    before = (count(session, Job), count(session, IngestBatch), count(session, StepRecord))
    changed = {**first, "events": [step(1), step(2)], "world_size": 8, "attempt": 1}
    assert client.post("/api/v1/ingest", json=changed, headers=INGEST).status_code == 409
    session.expire_all()
    assert (count(session, Job), count(session, IngestBatch), count(session, StepRecord)) == before
    assert session.scalars(select(Job)).one().attempt == 0
