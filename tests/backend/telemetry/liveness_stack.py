"""A distributed-mode API on the test's PostgreSQL and a given Redis, for the liveness tests:
ingest through it, count the statements that write ``ranks``, read back what SQL holds."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import Engine, event, select
from sqlalchemy.orm import Session, sessionmaker

from backend.api import create_app
from backend.celery_app import configure
from backend.jobs.models import Job, Rank
from backend.settings import Settings
from tests.conftest import INGEST
from tests.factories import batch

JOB = "liveness-job"
T0 = time.time() - 1000.0  # the job's clock: recent, so heartbeat ages mean something


@contextmanager
def distributed_client(
    *, db_url: str, redis_url: str, engine: Engine, factory: sessionmaker[Session]
) -> Iterator[TestClient]:
    """The API with ``VIGIL_REDIS_URL`` set (no detection scheduler: tests sweep by hand);
    the process's runtime goes back to embedded mode afterwards."""
    settings = Settings(
        database_url=db_url,
        redis_url=redis_url,
        liveness_store="redis",
        env="development",
        token_cache_s=0,
        detect_interval_s=0,
    )
    try:
        with TestClient(create_app(settings, engine=engine, session_factory=factory)) as client:
            yield client
    finally:
        configure(Settings(database_url=db_url))


@contextmanager
def rank_writes(engine: Engine) -> Iterator[list[str]]:
    """Every statement that inserts or updates ``ranks`` rows while the block runs."""
    seen: list[str] = []

    def count(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        if statement.lstrip().upper().startswith("INSERT INTO RANKS"):
            seen.append(statement)

    event.listen(engine, "before_cursor_execute", count)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", count)


def post(client: TestClient, events: list[dict[str, Any]], *, rank: int, **fields: Any) -> None:
    body = batch(events, job=JOB, rank=rank, world_size=fields.pop("world_size", 4), **fields)
    reply = client.post("/api/v1/ingest", json=body, headers=INGEST)
    assert reply.status_code == 200, reply.text


def beat(ts: float, step: int = 121, **fields: Any) -> dict[str, Any]:
    return {"type": "heartbeat", "ts": ts, "step": step, **fields}


def steps(first: int, last: int) -> list[dict[str, Any]]:
    """Steps ``first``..``last`` at 1 s each on the job's clock (0.4 s long)."""
    return [
        {"type": "step", "step": n, "ts": T0 + n, "duration_s": 0.4, "comm_s": 0.1, "loss": 2.0}
        for n in range(first, last + 1)
    ]


def job_id(session: Session) -> int:
    found = session.scalar(select(Job.id).where(Job.name == JOB))
    assert found is not None
    return found


def sql_rank(session: Session, rank: int) -> Rank:
    session.expire_all()  # read what the database holds now
    row = session.scalar(select(Rank).where(Rank.job_id == job_id(session), Rank.rank == rank))
    assert row is not None
    return row
