"""``POST /api/v1/ingest/multi`` stores a request's lines in bulk: one transaction, one
statement per table however many lines (and one Redis round trip for the ranks' liveness),
with every line answered and stored exactly as it would be posted alone, in order."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import redis.connection
from sqlalchemy import Engine, event, select
from sqlalchemy import exc as sa_exc
from sqlalchemy.orm import Session, sessionmaker

from backend.actions.models import Action
from backend.db import Base
from backend.jobs.models import Job, Run
from backend.telemetry.models import StepRecord
from tests.backend.telemetry.liveness_stack import distributed_client
from tests.conftest import ADMIN, INGEST
from tests.factories import batch, every_event_type, step

NDJSON = {**INGEST, "Content-Type": "application/x-ndjson"}
T0 = 1_732_233_000.0


def line(body: dict[str, Any]) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()


def multi(client: Any, *lines: bytes) -> list[dict[str, Any]]:
    reply = client.post("/api/v1/ingest/multi", content=b"\n".join(lines), headers=NDJSON)
    assert reply.status_code == 200, reply.text
    return reply.json()["results"]  # type: ignore[no-any-return]


def training(n: int, rank: int) -> list[dict[str, Any]]:
    """A rank's batch for step ``n`` as a DDP job sends it: the step (with its shape
    fingerprint), a collective aggregate and a heartbeat."""
    collective = {"type": "collective", "step": n, "group": "dp", "op": "all_reduce", "seq": n}
    collective |= {"bytes": 4096 * (rank + 1), "duration_s": 0.01 + rank / 1000, "count": 4}
    return [
        step(n, shape_fp="fp-a"),
        collective,
        {"type": "heartbeat", "ts": T0 + n + 0.5, "step": n + 1},
    ]


@contextmanager
def statements(engine: Engine) -> Iterator[list[str]]:
    seen: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        seen.append(" ".join(statement.split()).upper())

    event.listen(engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", record)


@contextmanager
def commits(factory: sessionmaker[Session]) -> Iterator[list[int]]:
    done: list[int] = []

    def record(session: Session) -> None:
        done.append(1)

    event.listen(factory, "after_commit", record)
    try:
        yield done
    finally:
        event.remove(factory, "after_commit", record)


def test_a_relay_request_is_one_transaction_and_a_statement_per_table(
    client, engine, session_factory
):
    ranks = 64
    first = [line(batch([step(0)], rank=r, world_size=ranks)) for r in range(ranks)]
    assert {r["status"] for r in multi(client, *first)} == {200}
    counts = {}
    for n in (8, ranks):
        lines = [line(batch(training(n, r), rank=r, world_size=ranks)) for r in range(n)]
        with statements(engine) as seen, commits(session_factory) as done:
            results = multi(client, *lines)
        assert [r["status"] for r in results] == [200] * n
        assert len(done) == 1, f"{n} lines took {len(done)} transactions"
        for table in ("INGEST_BATCHES", "STEP_ROLLUPS", "COLLECTIVE_ROLLUPS", "RANKS"):
            writes = [s for s in seen if s.startswith(f"INSERT INTO {table} ")]
            assert len(writes) == 1, f"{n} lines: {len(writes)} INSERTs into {table}"
        counts[n] = len(seen)
    assert counts[ranks] == counts[8], f"statements grow with the lines: {counts}"


# -- a mixed request answers and stores what single posts would -------------------------------

SKIP_COLUMNS = {"id", "content_hash", "run_id", "action_id", "incident_id", "collectives.ts"}


def snapshot(session: Session, suffix: str) -> dict[str, Any]:
    """What the request stored for the jobs named ``*{suffix}``, without ids and times."""
    session.expire_all()
    jobs = {
        job_id: name.removesuffix(suffix)
        for job_id, name in session.execute(select(Job.id, Job.name))
        if name.endswith(suffix)
    }
    out: dict[str, Any] = {}
    for table in Base.metadata.sorted_tables:
        if "job_id" not in table.c or table.name in ("actions", "runs"):
            continue
        columns = [
            c
            for c in table.c
            if not {c.name, f"{table.name}.{c.name}"} & SKIP_COLUMNS
            and "DateTime" not in repr(c.type)  # times of receipt
        ]
        rows = session.execute(select(*columns).where(table.c.job_id.in_(jobs)))
        out[table.name] = sorted(
            repr({**row._asdict(), "job_id": jobs[row.job_id]}).replace(suffix, "") for row in rows
        )
    out["jobs"] = sorted(
        (jobs[j.id], j.kind, j.world_size, j.attempt)
        for j in session.scalars(select(Job).where(Job.id.in_(jobs)))
    )
    out["runs"] = sorted(
        (jobs[r.job_id], r.number, r.first_attempt, r.state)
        for r in session.scalars(select(Run).where(Run.job_id.in_(jobs)))
    )
    out["actions"] = sorted(
        (jobs[a.job_id], a.kind, a.state, sorted((k, d["state"]) for k, d in a.deliveries.items()))
        for a in session.scalars(select(Action).where(Action.job_id.in_(jobs)))
    )
    return out


def mixed_request(client: Any, suffix: str) -> list[bytes]:
    """A job's ranks started (and one batch stored) through single posts, an action for rank
    2, then the lines of one relay request: good lines, a malformed and an invalid one,
    retries (of a stored batch, of a line of the request), a reused ``batch_id``, a rank's
    second batch, an elastic world size, a second job, another kind, an action report, a
    restart and a lagging rank."""
    job, other = f"job-a{suffix}", f"job-b{suffix}"
    ids = itertools.count()

    def b(events: list[dict[str, Any]], rank: int, **fields: Any) -> dict[str, Any]:
        fields.setdefault("world_size", 4)
        fields.setdefault("batch_id", f"{fields.get('job', job)}-{rank}-{next(ids)}")
        return batch(events, job=fields.pop("job", job), rank=rank, **fields)

    sent: list[bytes] = []
    for r in range(4):
        sent.append(line(b(training(0, r), r)))
    stored = line(b(training(1, 1), 1))
    sent.append(stored)
    for body in sent:
        assert client.post("/api/v1/ingest", content=body, headers=INGEST).status_code == 200
    created = client.post(
        f"/api/v1/jobs/{job}/actions",
        json={"kind": "dump_stacks", "target_ranks": [2], "reason": "test"},
        headers=ADMIN,
    )
    assert created.status_code == 201, created.text
    action = created.json()["id"]
    first = b([*training(2, 0), *every_event_type()], 0)
    report = {"type": "action", "id": action, "state": "succeeded", "result": {"ok": 1}}
    lines = [
        line(first),
        b"{not json",
        line(b([step(3, duration_s=-1.0)], 1)),
        stored,
        line(b(training(2, 2), 2)),
        line({**first, "events": [step(9)]}),  # the first line's batch_id, other content
        line(first),
        line(b(training(3, 0), 0)),
        line(b(training(0, 0), 0, job=other, world_size=2)),
        line(b([step(2)], 1, world_size=8)),  # elastic
        line(b(training(2, 3), 3)),
        line(b(training(1, 1), 1, job=other, world_size=2)),
        line(b([], 0, kind="serving")),
        line(b([report], 2)),
        line(b(training(3, 2), 2)),
        line(b(training(4, 0), 0, attempt=1)),  # a restart
        line(b(training(4, 1), 1)),  # a lagging rank of attempt 0
        line(b(training(5, 0), 0, attempt=1)),
    ]
    return lines


@pytest.mark.parametrize("db_url", ["sqlite", "postgres"], indirect=True)
def test_a_mixed_request_answers_and_stores_what_single_posts_would(client, session):
    single = []
    for body in mixed_request(client, "-single"):
        reply = client.post("/api/v1/ingest", content=body, headers=INGEST)
        single.append({"status": reply.status_code, **reply.json()})
    merged = multi(client, *mixed_request(client, "-multi"))

    def same(results: list[dict[str, Any]], suffix: str) -> str:
        text = json.dumps(results, sort_keys=True).replace(suffix, "")
        for a in session.scalars(select(Action.id)):
            text = text.replace(f'"id": {a},', '"id": "an action",')
        return text

    assert same(merged, "-multi") == same(single, "-single")
    assert [r["status"] for r in merged] == [
        200, 400, 422, 200, 200, 409, 200, 200, 200, 200, 200, 200, 409, 200, 200, 200, 200, 200
    ]  # fmt: skip
    assert merged[3]["duplicate"] is merged[6]["duplicate"] is True
    assert [len(r["actions"]) for r in merged[:5] if r["status"] == 200] == [0, 0, 1]
    assert snapshot(session, "-multi") == snapshot(session, "-single")


def test_a_line_that_fails_in_the_database_fails_alone(client, session, monkeypatch, caplog):
    """An unexpected database error from one line's rows (here made up, on rank 13) takes
    the request's other lines through their own transactions: they are stored."""
    import backend.db

    real = backend.db.bulk_insert

    def bulk_insert(session: Session, table: Any, rows: list[dict[str, Any]]) -> None:
        if any(row.get("rank") == 13 for row in rows):
            raise sa_exc.IntegrityError("INSERT", {}, Exception("made up for the test"))
        real(session, table, rows)

    monkeypatch.setattr("backend.ingest.service.bulk_insert", bulk_insert)
    lines = [line(batch([step(1)], rank=r, world_size=16)) for r in (12, 13, 14)]
    results = multi(client, *lines)
    assert [r["status"] for r in results] == [200, 500, 200]
    assert "ingest/multi: unexpected error at line 1" in caplog.text
    session.expire_all()
    assert sorted(session.scalars(select(StepRecord.rank))) == [12, 14]


# -- liveness in Redis: one round trip per request --------------------------------------------


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_ranks_liveness_is_one_redis_round_trip_per_request(
    db_url, redis_url, engine, session_factory, monkeypatch
):
    sends: list[int] = []
    real = redis.connection.AbstractConnection.send_packed_command

    def send(self: Any, *args: Any, **kwargs: Any) -> None:
        sends.append(1)
        real(self, *args, **kwargs)

    monkeypatch.setattr(redis.connection.AbstractConnection, "send_packed_command", send)
    ranks = 64
    with distributed_client(
        db_url=db_url, redis_url=redis_url, engine=engine, factory=session_factory
    ) as client:
        # The job's first batch, then new ranks: their state is written to SQL at once,
        # and confirmed in Redis after the commit.
        post = client.post(
            "/api/v1/ingest", json=batch([step(0)], world_size=ranks), headers=INGEST
        )
        assert post.status_code == 200, post.text
        trips = {}
        for n in (8, ranks):
            lines = [line(batch(training(n, r), rank=r, world_size=ranks)) for r in range(n)]
            sends.clear()
            assert [r["status"] for r in multi(client, *lines)] == [200] * n
            trips[f"new ranks, {n} lines"] = len(sends)
        # Heartbeats of known ranks: Redis alone.
        for n in (8, ranks):
            lines = [line(batch(training(n + 1, r), rank=r, world_size=ranks)) for r in range(n)]
            sends.clear()
            assert [r["status"] for r in multi(client, *lines)] == [200] * n
            trips[f"known ranks, {n} lines"] = len(sends)
        beats = client.get("/api/v1/jobs/llama-8b-pretrain/ranks", headers=ADMIN).json()
    assert trips == {
        "new ranks, 8 lines": 2,  # the states merged, then what SQL holds confirmed
        "new ranks, 64 lines": 2,
        "known ranks, 8 lines": 1,
        "known ranks, 64 lines": 1,
    }
    # Every rank's latest heartbeat is the one of the last request.
    assert {r["rank"]: r["last_heartbeat_ts"] for r in beats} == dict.fromkeys(
        range(ranks), T0 + ranks + 1.5
    )
