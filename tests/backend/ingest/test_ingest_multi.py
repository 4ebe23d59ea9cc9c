"""``POST /api/v1/ingest/multi`` (issue 16, the relay's endpoint): NDJSON, one ingest batch
per line, each validated, deduplicated and stored on its own, one result per batch in order;
a line's content hash is that of the same body sent alone."""

from __future__ import annotations

import gzip
import json

from sqlalchemy import func, select

from backend.ingest.models import IngestBatch
from backend.telemetry.models import StepRecord
from tests.conftest import ADMIN, INGEST
from tests.factories import batch, step

NDJSON = {**INGEST, "Content-Type": "application/x-ndjson"}


def line(body: dict) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()


def multi(client, *bodies: bytes, headers=NDJSON):  # type: ignore[no-untyped-def]
    return client.post("/api/v1/ingest/multi", content=b"\n".join(bodies), headers=headers)


def stored_steps(session) -> list[tuple[int, int]]:  # type: ignore[no-untyped-def]
    session.expire_all()
    return sorted((r, s) for r, s in session.execute(select(StepRecord.rank, StepRecord.step)))


def test_each_line_is_stored_on_its_own_and_answered_in_order(client, session):
    good0 = batch([step(1), step(2)], rank=0)
    bad = batch([step(1), step(2, duration_s=-1.0)], rank=1)
    good2 = batch([step(1)], rank=2)
    reply = multi(client, line(good0), line(bad), line(good2))
    assert reply.status_code == 200, reply.text
    first, second, third = reply.json()["results"]
    assert first == {"status": 200, "accepted": 2, "duplicate": False, "actions": []}
    assert second["status"] == 422 and second["error"] == "invalid"
    assert [e["field"] for e in second["detail"]] == ["events[1].duration_s"]
    assert third == {"status": 200, "accepted": 1, "duplicate": False, "actions": []}
    # Nothing of the refused batch: neither its good step nor its batch row.
    assert stored_steps(session) == [(0, 1), (0, 2), (2, 1)]
    ids = set(session.scalars(select(IngestBatch.batch_id)))
    assert bad["batch_id"] not in ids and {good0["batch_id"], good2["batch_id"]} <= ids


def test_a_retry_is_the_same_batch_alone_or_merged(client, session):
    """The relay forwards a rank's body as it came: the same bytes are the same batch on
    either endpoint, and inside one request; other content under the id is a 409."""
    sent = batch([step(1)], rank=0)
    alone = client.post("/api/v1/ingest", content=line(sent), headers=INGEST)
    assert alone.json()["duplicate"] is False
    reply = multi(client, line(sent), line(sent))
    assert [r["duplicate"] for r in reply.json()["results"]] == [True, True]
    fresh = batch([step(2)], rank=0)
    assert multi(client, line(fresh)).json()["results"][0]["duplicate"] is False
    again = client.post("/api/v1/ingest", content=line(fresh), headers=INGEST)
    assert again.json()["duplicate"] is True
    changed = line({**sent, "events": [step(9)]})
    (result,) = multi(client, changed).json()["results"]
    assert result["status"] == 409 and result["error"] == "batch_id_reused"
    assert result["batch_id"] == sent["batch_id"]
    assert stored_steps(session) == [(0, 1), (0, 2)]


def test_actions_reach_only_the_rank_they_target(client):
    ranks = [batch([step(1)], rank=r, world_size=3) for r in range(3)]
    multi(client, *map(line, ranks))
    action = {"kind": "dump_stacks", "target_ranks": [1], "reason": "test"}
    created = client.post("/api/v1/jobs/llama-8b-pretrain/actions", json=action, headers=ADMIN)
    assert created.status_code == 201, created.text
    beats = [
        batch([{"type": "heartbeat", "ts": 1_732_233_010.0, "step": 2}], rank=r, world_size=3)
        for r in range(3)
    ]
    results = multi(client, *map(line, beats)).json()["results"]
    assert [[a["id"] for a in r["actions"]] for r in results] == [[], [created.json()["id"]], []]


def test_gzip_and_blank_lines(client, session):
    body = b"\n\n".join(line(batch([step(n)], rank=n)) for n in range(3)) + b"\n"
    headers = {**NDJSON, "Content-Encoding": "gzip"}
    reply = client.post("/api/v1/ingest/multi", content=gzip.compress(body), headers=headers)
    assert [r["status"] for r in reply.json()["results"]] == [200, 200, 200]
    assert stored_steps(session) == [(0, 0), (1, 1), (2, 2)]


def test_request_level_refusals_name_the_problem(client, session):
    one = line(batch([step(1)]))
    no_token = client.post(
        "/api/v1/ingest/multi", content=one, headers={"Content-Type": "application/x-ndjson"}
    )
    assert no_token.status_code == 401
    as_json = multi(client, one, headers={**INGEST, "Content-Type": "application/json"})
    assert as_json.status_code == 415 and "application/x-ndjson" in as_json.json()["detail"]
    empty = multi(client, b"  \n\n")
    assert empty.status_code == 400 and "no batch" in empty.json()["detail"]
    many = multi(client, *[line(batch([step(1)])) for _ in range(1001)])
    assert many.status_code == 413 and "batches: 1001 lines" in many.json()["detail"]
    not_json = multi(client, b"{not json")
    (result,) = not_json.json()["results"]
    assert result["status"] == 400 and "not valid JSON" in result["detail"]
    assert int(session.scalar(select(func.count()).select_from(StepRecord))) == 0
