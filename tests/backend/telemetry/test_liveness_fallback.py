"""Distributed mode without its Redis: liveness falls back to the rank's SQL row (every
batch acknowledged keeps its state, ingest never fails for it, one warning per outage),
the sweep reads SQL alone, and when Redis is back (empty, as after a restart without
persistence) heartbeats go to Redis again, SQL written once more since Redis knows nothing."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from backend.detection.runner import sweep_job
from backend.telemetry import liveness, liveness_store
from tests.backend.telemetry.liveness_stack import (
    JOB,
    T0,
    beat,
    distributed_client,
    job_id,
    post,
    rank_writes,
    sql_rank,
    steps,
)
from tests.conftest import ADMIN
from tests.reliability.services import REDIS_SERVER, RedisServer
from tests.servers import free_port

pytestmark = pytest.mark.parametrize("db_url", ["postgres"], indirect=True)

DOWN = "liveness: Redis unavailable"
BACK = "liveness: Redis is back"


@pytest.fixture
def fast_retry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ask Redis again at every batch (not after RETRY_S): the warning must still be one."""
    monkeypatch.setattr(liveness_store, "RETRY_S", 0.0)


def warnings(caplog: pytest.LogCaptureFixture, text: str) -> int:
    return sum(text in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)


def test_no_redis_every_heartbeat_goes_to_sql_and_ingest_works(
    db_url: str,
    engine: Engine,
    session_factory: sessionmaker[Session],
    session: Session,
    caplog: pytest.LogCaptureFixture,
    fast_retry: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    nobody = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    caplog.set_level(logging.WARNING, logger="backend.telemetry")
    with (
        distributed_client(
            db_url=db_url, redis_url=nobody, engine=engine, factory=session_factory
        ) as client,
        rank_writes(engine) as writes,
    ):
        for rank in range(4):
            post(client, [*steps(0, 120), beat(T0 + 120.5)], rank=rank)
        for rank in (0, 1, 3):  # rank 2 falls silent
            post(client, [beat(T0 + 160)], rank=rank)
        assert len(writes) == 7, "every batch's state goes to SQL"
        assert sql_rank(session, 0).last_heartbeat_ts == T0 + 160
        assert warnings(caplog, DOWN) == 1

        # Just lost, Redis may hold newer state than SQL: hangs and crashes wait.
        assert not sweep_job(session=session, job_id=job_id(session), now=T0 + 160.5)
        # Down for TRUST_SQL_AFTER_S, ingest has written every live rank to SQL since.
        monkeypatch.setattr(liveness, "TRUST_SQL_AFTER_S", 0.0)
        sweep_job(session=session, job_id=job_id(session), now=T0 + 160.5)
        session.commit()
        [incident] = client.get(f"/api/v1/jobs/{JOB}/incidents", headers=ADMIN).json()
        assert (incident["kind"], incident["ranks"]) == ("crash", [2])


@pytest.fixture
def redis_server(tmp_path) -> Iterator[RedisServer]:  # type: ignore[no-untyped-def]
    if REDIS_SERVER is None:
        pytest.skip("needs the redis-server binary")
    server = RedisServer(tmp_path)
    server.start()
    yield server
    server.stop(kill=True)


@pytest.fixture
def client(
    db_url: str,
    redis_server: RedisServer,
    engine: Engine,
    session_factory: sessionmaker[Session],
) -> Iterator[TestClient]:
    with distributed_client(
        db_url=db_url, redis_url=redis_server.url, engine=engine, factory=session_factory
    ) as c:
        yield c


def test_redis_lost_and_back_nothing_acknowledged_is_lost(
    client: TestClient,
    redis_server: RedisServer,
    session: Session,
    engine: Engine,
    caplog: pytest.LogCaptureFixture,
    fast_retry: None,
) -> None:
    caplog.set_level(logging.WARNING, logger="backend.telemetry")
    post(client, [*steps(0, 10), beat(T0 + 10.5)], rank=0)
    with rank_writes(engine) as writes:
        post(client, [beat(T0 + 11)], rank=0)
        assert len(writes) == 0  # Redis has it

        redis_server.stop(kill=True)
        post(client, [beat(T0 + 12, step=12)], rank=0)
        post(client, [*steps(11, 12), beat(T0 + 13, step=13)], rank=0)
        assert len(writes) == 2, "with Redis gone each batch's state goes to SQL"
        row = sql_rank(session, 0)
        assert (row.last_step, row.current_step, row.last_heartbeat_ts) == (12, 13, T0 + 13)
        assert warnings(caplog, DOWN) == 1
        [shown] = client.get(f"/api/v1/jobs/{JOB}/ranks", headers=ADMIN).json()
        assert shown["last_heartbeat_ts"] == T0 + 13  # the API reads SQL alone meanwhile

        redis_server.start()  # the same port, empty
        post(client, [beat(T0 + 14, step=13)], rank=0)
        assert len(writes) == 3, "Redis forgot what SQL holds: SQL is written once more"
        post(client, [beat(T0 + 15, step=13)], rank=0)
        assert len(writes) == 3, "and then heartbeats stay in Redis again"
        assert warnings(caplog, BACK) == 1
    [shown] = client.get(f"/api/v1/jobs/{JOB}/ranks", headers=ADMIN).json()
    assert (shown["last_step"], shown["last_heartbeat_ts"]) == (12, T0 + 15)
