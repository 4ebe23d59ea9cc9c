"""The ingest contract for good input: everything stored once, exactly as sent."""

from __future__ import annotations

import gzip
import json
import math

from sqlalchemy import func, select

from backend.ingest.models import IngestBatch
from backend.jobs.models import Job, Rank
from backend.telemetry.models import (
    CollectiveRecord,
    JobEvent,
    MetricPoint,
    OpSequence,
    ServingRequest,
    StepRecord,
)
from tests.conftest import ADMIN, INGEST
from tests.factories import batch, every_event_type, step

TABLES = [StepRecord, CollectiveRecord, OpSequence, ServingRequest, MetricPoint, JobEvent]


def counts(session) -> dict[str, int]:  # type: ignore[no-untyped-def]
    out = {m.__tablename__: session.scalar(select(func.count()).select_from(m)) for m in TABLES}
    out["ingest_batches"] = session.scalar(select(func.count()).select_from(IngestBatch))
    out["jobs"] = session.scalar(select(func.count()).select_from(Job))
    return out


def test_every_event_type_is_stored(client, session):
    body = batch(every_event_type(), rank=3, world_size=16, host="node-7")
    reply = client.post("/api/v1/ingest", json=body, headers=INGEST)
    assert reply.status_code == 200, reply.text
    assert reply.json() == {"accepted": 7, "duplicate": False, "actions": []}

    assert counts(session) == {
        "steps": 1,
        "collectives": 1,
        "opseqs": 1,
        "requests": 1,
        "metrics": 1,
        "job_events": 1,
        "ingest_batches": 1,
        "jobs": 1,
    }
    s = session.scalars(select(StepRecord)).one()
    assert (s.rank, s.step, s.duration_s, s.comm_s, s.data_s) == (3, 120, 0.31, 0.05, 0.01)
    assert (s.loss, s.grad_norm, s.mem_bytes, s.opseq) == (2.31, 1.1, 1_234_567, "9f2c")
    c = session.scalars(select(CollectiveRecord)).one()
    assert (c.group, c.op, c.seq, c.bytes, c.count) == ("dp", "all_reduce", 4501, 4_194_304, 8)
    op = session.scalars(select(OpSequence)).one()
    assert op.ops == [["aten::mm", [[8, 256], [256, 256]], 8192]]
    r = session.scalars(select(ServingRequest)).one()
    assert (r.request_id, r.first_token, r.end, r.max_tbt_s) == ("r-17", 1.2, 3.4, 0.09)
    assert session.scalars(select(JobEvent)).one().attrs == {"path": "/ckpt/120"}
    job = session.scalars(select(Job)).one()
    assert (job.name, job.kind, job.world_size) == ("llama-8b-pretrain", "training", 16)


def test_heartbeat_updates_rank_state(client, session):
    client.post("/api/v1/ingest", json=batch(every_event_type(), rank=2), headers=INGEST)
    rank = session.scalars(select(Rank)).one()
    assert (rank.rank, rank.last_step, rank.current_step) == (2, 120, 121)
    assert rank.inflight == {
        "group": "dp",
        "op": "all_reduce",
        "seq": 4502,
        "since": 1_732_233_120.5,
    }

    # A later heartbeat outside any collective clears the in-flight collective...
    later = {"type": "heartbeat", "ts": 1_732_233_130.0, "step": 125, "inflight": None}
    client.post("/api/v1/ingest", json=batch([later], rank=2), headers=INGEST)
    session.expire_all()
    rank = session.scalars(select(Rank)).one()
    assert (rank.current_step, rank.inflight) == (125, None)

    # ...and a late, older batch does not overwrite fresher state.
    stale = {
        "type": "heartbeat",
        "ts": 1_732_233_125.0,
        "step": 123,
        "inflight": {"group": "tp", "op": "all_gather", "since": 1_732_233_124.0},
    }
    client.post("/api/v1/ingest", json=batch([stale, step(110)], rank=2), headers=INGEST)
    session.expire_all()
    rank = session.scalars(select(Rank)).one()
    assert (rank.current_step, rank.inflight, rank.last_step) == (125, None, 120)


def test_repeated_batch_id_is_acknowledged_but_stored_once(client, session):
    body = batch([step(1), step(2)])
    first = client.post("/api/v1/ingest", json=body, headers=INGEST)
    again = client.post("/api/v1/ingest", json=body, headers=INGEST)
    assert first.json() == {"accepted": 2, "duplicate": False, "actions": []}
    assert again.status_code == 200
    assert again.json() == {"accepted": 2, "duplicate": True, "actions": []}
    assert counts(session)["steps"] == 2
    assert counts(session)["ingest_batches"] == 1


def test_gzip_body(client, session):
    raw = json.dumps(batch([step(n) for n in range(100)])).encode()
    reply = client.post(
        "/api/v1/ingest",
        content=gzip.compress(raw),
        headers={**INGEST, "Content-Type": "application/json", "Content-Encoding": "gzip"},
    )
    assert reply.status_code == 200, reply.text
    assert reply.json()["accepted"] == 100
    assert counts(session)["steps"] == 100


def test_nan_and_inf_loss_are_kept_as_the_signal(client, session):
    # Python's json writes NaN/Infinity literals; the collector sends exactly that.
    body = json.dumps(batch([step(1, loss=math.nan, grad_norm=math.inf)]))
    reply = client.post(
        "/api/v1/ingest", content=body, headers={**INGEST, "Content-Type": "application/json"}
    )
    assert reply.status_code == 200, reply.text
    stored = session.scalars(select(StepRecord)).one()
    assert math.isnan(stored.loss) and stored.grad_norm == math.inf

    page = client.get("/api/v1/jobs/llama-8b-pretrain/steps", headers=ADMIN).json()
    assert page["items"][0]["loss"] == "NaN"
    assert page["items"][0]["grad_norm"] == "Infinity"


def test_unknown_fields_are_ignored_for_forward_compatibility(client, session):
    body = batch([step(1, future_field=1)], collector_version="9.9")
    assert client.post("/api/v1/ingest", json=body, headers=INGEST).status_code == 200
    assert counts(session)["steps"] == 1


def test_empty_batch_is_a_cheap_ping(client, session):
    reply = client.post("/api/v1/ingest", json=batch([]), headers=INGEST)
    assert reply.json() == {"accepted": 0, "duplicate": False, "actions": []}


def test_opseq_is_stored_once_per_job(client, session):
    ops = {"type": "opseq", "hash": "abc", "ops": [["aten::add", [[2]], 0]]}
    for rank in range(3):
        client.post("/api/v1/ingest", json=batch([ops], rank=rank), headers=INGEST)
    assert counts(session)["opseqs"] == 1
    assert session.scalars(select(OpSequence)).one().first_rank == 0


def test_restart_attempt_and_world_size_follow_the_newest_attempt(client, session):
    client.post("/api/v1/ingest", json=batch([step(1)], world_size=4), headers=INGEST)
    client.post("/api/v1/ingest", json=batch([step(1)], world_size=3, attempt=1), headers=INGEST)
    job = session.scalars(select(Job)).one()
    session.refresh(job)
    assert (job.world_size, job.attempt) == (3, 1)
    assert sorted(session.scalars(select(StepRecord.attempt))) == [0, 1]
