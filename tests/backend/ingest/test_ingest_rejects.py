"""Bad input gets a clear 4xx naming what is wrong, and nothing of the batch is stored."""

from __future__ import annotations

import gzip
import json

import pytest
from sqlalchemy import func, select

from backend.ingest.models import IngestBatch
from backend.jobs.models import Job, Rank
from backend.telemetry.models import StepRecord
from tests.conftest import INGEST
from tests.factories import batch, every_event_type, step


def nothing_stored(session) -> bool:  # type: ignore[no-untyped-def]
    return all(
        session.scalar(select(func.count()).select_from(model)) == 0
        for model in (StepRecord, IngestBatch, Job, Rank)
    )


def post_json(client, text: str, headers=INGEST):  # type: ignore[no-untyped-def]
    return client.post(
        "/api/v1/ingest", content=text, headers={**headers, "Content-Type": "application/json"}
    )


# (what is wrong, the batch, the field the reply must name)
CASES = [
    ("unknown event type", batch([step(1), {"type": "gpu_temp", "c": 80}]), "events[1]"),
    ("negative duration", batch([step(1), step(2, duration_s=-0.1)]), "events[1].duration_s"),
    ("negative comm time", batch([step(1, comm_s=-1)]), "events[0].comm_s"),
    ("negative step", batch([step(-1)]), "events[0].step"),
    ("step beyond 2**53", batch([step(2**60)]), "events[0].step"),
    ("rank outside world", batch([step(1)], rank=4, world_size=4), "rank"),
    ("missing batch_id", {k: v for k, v in batch().items() if k != "batch_id"}, "batch_id"),
    ("job with a slash", batch([step(1)], job="a/b"), "job"),
    ("empty job", batch([step(1)], job=""), "job"),
    ("unknown kind", batch([step(1)], kind="inference"), "kind"),
    ("missing step ts", batch([{k: v for k, v in step(1).items() if k != "ts"}]), "events[0].ts"),
    (
        "collective without op",
        batch([{"type": "collective", "group": "dp", "duration_s": 1}]),
        "events[0].op",
    ),
    ("string as number", batch([step(1, duration_s="fast")]), "events[0].duration_s"),
    (
        "request ends before it starts",
        batch([{"type": "request", "id": "r", "arrival": 5.0, "end": 1.0}]),
        "events[0].end",
    ),
]


@pytest.mark.parametrize(("what", "body", "field"), CASES, ids=[c[0] for c in CASES])
def test_invalid_field_is_named_and_nothing_stored(client, session, what, body, field):
    reply = client.post("/api/v1/ingest", json=body, headers=INGEST)
    assert reply.status_code == 422, reply.text
    fields = [e["field"] for e in reply.json()["detail"]]
    assert field in fields, f"{what}: reply named {fields}"
    assert nothing_stored(session)


@pytest.mark.parametrize("field", ["duration_s", "ts", "comm_s"])
@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_inf_refused_where_not_a_signal(client, session, field, literal):
    text = json.dumps(batch([step(1, **{field: 0.5})])).replace("0.5", literal)
    reply = post_json(client, text)
    assert reply.status_code == 422, reply.text
    assert reply.json()["detail"][0]["field"] == f"events[0].{field}"
    assert nothing_stored(session)


def test_one_bad_event_rejects_the_whole_batch(client, session):
    events = [step(n) for n in range(500)] + every_event_type()
    events[321]["duration_s"] = -1
    reply = client.post("/api/v1/ingest", json=batch(events), headers=INGEST)
    assert reply.status_code == 422
    assert reply.json()["detail"][0]["field"] == "events[321].duration_s"
    assert nothing_stored(session)


def test_invalid_json_is_400(client, session):
    reply = post_json(client, '{"batch_id": "x", "job": ')
    assert reply.status_code == 400
    assert "not valid JSON" in reply.json()["detail"]
    assert nothing_stored(session)


def test_invalid_gzip_is_400(client, session):
    reply = client.post(
        "/api/v1/ingest",
        content=b"definitely not gzip",
        headers={**INGEST, "Content-Type": "application/json", "Content-Encoding": "gzip"},
    )
    assert reply.status_code == 400
    assert "gzip" in reply.json()["detail"]


def test_unsupported_encoding_and_content_type_are_415(client, session):
    body = json.dumps(batch([step(1)]))
    br = client.post(
        "/api/v1/ingest",
        content=body,
        headers={**INGEST, "Content-Type": "application/json", "Content-Encoding": "br"},
    )
    form = client.post(
        "/api/v1/ingest",
        content=body,
        headers={**INGEST, "Content-Type": "application/x-www-form-urlencoded"},
    )
    assert (br.status_code, form.status_code) == (415, 415)
    assert "content-encoding" in br.json()["detail"]
    assert nothing_stored(session)


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({}, 401),
        ({"Authorization": "Bearer wrong-token"}, 401),
        ({"Authorization": "Basic dXNlcjpwYXNz"}, 401),
    ],
)
def test_wrong_token_is_refused_and_nothing_stored(client, session, headers, status):
    reply = client.post("/api/v1/ingest", json=batch([step(1)]), headers=headers)
    assert reply.status_code == status
    assert reply.headers["www-authenticate"] == "Bearer"
    assert nothing_stored(session)


def test_kind_conflict_with_existing_job_is_409(client, session):
    client.post("/api/v1/ingest", json=batch([step(1)]), headers=INGEST)
    reply = client.post("/api/v1/ingest", json=batch([step(2)], kind="serving"), headers=INGEST)
    assert reply.status_code == 409
    assert "training job" in reply.json()["detail"]
    assert session.scalar(select(func.count()).select_from(StepRecord)) == 1


def test_database_failure_mid_batch_stores_nothing(client, session, monkeypatch):
    """A failure after some rows were written rolls back the whole batch."""
    from backend.ingest import service

    def explode(**_):  # type: ignore[no-untyped-def]
        raise RuntimeError("disk full")

    monkeypatch.setattr(service, "update_ranks", explode)  # runs after the bulk inserts
    with pytest.raises(RuntimeError):
        client.post("/api/v1/ingest", json=batch([step(1), step(2)]), headers=INGEST)
    assert nothing_stored(session)


def test_gzip_bomb_is_413(client, session):
    small = gzip.compress(b" " * (9 * 1024 * 1024))  # ~9 KB that inflates past 8 MiB
    reply = client.post(
        "/api/v1/ingest",
        content=small,
        headers={**INGEST, "Content-Type": "application/json", "Content-Encoding": "gzip"},
    )
    assert reply.status_code == 413
    assert "decompressed" in reply.json()["detail"]


def post_gzip(client, body: bytes):  # type: ignore[no-untyped-def]
    return client.post(
        "/api/v1/ingest",
        content=body,
        headers={**INGEST, "Content-Type": "application/json", "Content-Encoding": "gzip"},
    )


@pytest.mark.parametrize(
    ("what", "after"),
    [
        ("a second gzip member", gzip.compress(b' "more": 1}')),
        ("trailing garbage", b"garbage"),
        ("a trailing zero byte", b"\x00"),
    ],
)
def test_data_after_the_gzip_stream_is_refused(client, session, what, after):
    """Data after the first gzip member would be silently ignored: refuse the body."""
    reply = post_gzip(client, gzip.compress(json.dumps(batch([step(1)])).encode()) + after)
    assert reply.status_code == 400, f"{what}: {reply.text}"
    assert "after the end of the gzip stream" in reply.json()["detail"]
    assert nothing_stored(session)


def test_one_gzip_member_is_accepted(client, session):
    reply = post_gzip(client, gzip.compress(json.dumps(batch([step(1)])).encode()))
    assert reply.status_code == 200, reply.text
