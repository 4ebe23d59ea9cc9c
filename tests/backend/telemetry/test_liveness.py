"""Liveness in Redis (distributed mode), on the test's PostgreSQL and Redis
(``VIGIL_TEST_REDIS_URL``): heartbeats and in-flight ops do not write the rank's SQL row;
what the run's life cycle acts on does, at once; hangs and crashes are still found with
the right ranks; the ranks API shows the latest heartbeat; the sweep writes a silent
rank's last state to SQL; an active rank's row is refreshed every ``SQL_REFRESH_S``."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from redis import Redis
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from backend.detection.runner import sweep_job
from backend.jobs.rank_state import rank_values
from backend.telemetry import liveness
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

pytestmark = pytest.mark.parametrize("db_url", ["postgres"], indirect=True)

WAITING = {"group": "world", "op": "all_reduce", "seq": 500, "since": T0 + 120.2}


@pytest.fixture
def client(
    db_url: str, redis_url: str, engine: Engine, session_factory: sessionmaker[Session]
) -> Iterator[TestClient]:
    with distributed_client(
        db_url=db_url, redis_url=redis_url, engine=engine, factory=session_factory
    ) as c:
        yield c


def start_job(client: TestClient, ranks: int = 4) -> None:
    """Steps 0..120 and a heartbeat from every rank: each rank's first batch."""
    for rank in range(ranks):
        post(client, [*steps(0, 120), beat(T0 + 120.5)], rank=rank, world_size=ranks)


def incidents(client: TestClient) -> list[dict]:  # type: ignore[type-arg]
    return client.get(f"/api/v1/jobs/{JOB}/incidents", headers=ADMIN).json()


def test_heartbeats_do_not_write_the_rank_row_and_the_api_shows_the_latest(client, session, engine):
    with rank_writes(engine) as writes:
        post(client, [*steps(0, 1), beat(T0 + 1.5)], rank=0)
        assert len(writes) == 1, "a new rank's row is written at once"
        for i in range(2, 32):
            post(client, [beat(T0 + i, step=i, inflight={**WAITING, "seq": i})], rank=0)
        assert len(writes) == 1, f"{len(writes) - 1} heartbeats wrote the rank row"

    row = sql_rank(session, 0)
    assert (row.last_heartbeat_ts, row.current_step, row.inflight) == (T0 + 1.5, 121, None)
    [shown] = client.get(f"/api/v1/jobs/{JOB}/ranks", headers=ADMIN).json()
    assert (shown["last_heartbeat_ts"], shown["current_step"]) == (T0 + 31, 31)
    assert shown["inflight"]["seq"] == 31
    assert shown["last_step"] == 1
    assert abs(shown["heartbeat_age_s"] - (time.time() - (T0 + 31))) < 5


def test_what_the_life_cycle_acts_on_is_written_at_once(client, session, engine):
    post(client, [*steps(0, 10), beat(T0 + 10.5, mem_capacity=80 * 2**30)], rank=0)
    with rank_writes(engine) as writes:
        post(client, [beat(T0 + 11)], rank=0)  # news of nothing: Redis only
        assert len(writes) == 0
        post(client, [beat(T0 + 12, exiting=True, exit_code=0)], rank=0)  # goodbye
        assert len(writes) == 1
        row = sql_rank(session, 0)
        assert (row.exited, row.exit_code, row.last_heartbeat_ts) == (True, 0, T0 + 12)
        assert row.mem_capacity == 80 * 2**30, "a heartbeat without a capacity keeps it"
        post(client, [beat(T0 + 20)], rank=0, attempt=1)  # torchrun restarted the group
        assert len(writes) == 2
        row = sql_rank(session, 0)
        assert (row.attempt, row.exited, row.last_heartbeat_ts) == (1, False, T0 + 20)


def test_a_hang_is_found_from_heartbeats_in_redis(client, session):
    start_job(client)
    # Ranks 0, 1, 3 wait in the all-reduce; rank 2 never entered it. Fresh heartbeats,
    # 80 s after the last step: all of it in Redis only.
    for rank in range(4):
        inflight = None if rank == 2 else WAITING
        post(client, [beat(T0 + 200, inflight=inflight)], rank=rank)
    assert sql_rank(session, 0).last_heartbeat_ts == T0 + 120.5, "SQL got a heartbeat"
    assert sql_rank(session, 0).inflight is None

    sweep_job(session=session, job_id=job_id(session), now=T0 + 200.5)
    session.commit()
    [incident] = incidents(client)
    assert (incident["kind"], incident["ranks"]) == ("hang", [2])


def test_a_crash_is_found_from_heartbeats_in_redis(client, session):
    start_job(client)
    for rank in (0, 1, 3):  # keep beating; rank 2 went silent at T0 + 120.5
        post(client, [beat(T0 + 160)], rank=rank)
    assert sql_rank(session, 1).last_heartbeat_ts == T0 + 120.5, "SQL got a heartbeat"

    sweep_job(session=session, job_id=job_id(session), now=T0 + 160.5)
    session.commit()
    [incident] = incidents(client)
    assert (incident["kind"], incident["ranks"]) == ("crash", [2])


def test_a_healthy_job_in_redis_sweeps_clean(client, session):
    start_job(client)
    for rank in range(4):
        post(client, [*steps(121, 125), beat(T0 + 125.5)], rank=rank)
    assert not sweep_job(session=session, job_id=job_id(session), now=T0 + 126)


def test_redis_losing_its_data_is_no_crash(client, session, redis_url):
    """SQL's copy is up to SQL_REFRESH_S old: alone, it would make every rank look
    crashed. Until Redis holds every recently seen rank again the sweep does not judge."""
    t = time.time()
    for rank in range(4):
        first = [{**e, "ts": t - 50 + e["step"]} for e in steps(0, 29)]
        post(client, [*first, beat(t - 20, step=30)], rank=rank)
    for rank in (0, 1, 3):
        post(client, [beat(t, step=30)], rank=rank)  # Redis only
    Redis.from_url(redis_url).flushdb()  # a restart without persistence

    assert not sweep_job(session=session, job_id=job_id(session), now=t + 0.5)
    for rank in (0, 1, 3):  # their next batches put them back
        post(client, [beat(t + 1, step=30)], rank=rank)
    assert not sweep_job(session=session, job_id=job_id(session), now=t + 1.5)

    for rank in (0, 1, 3):
        post(client, [beat(t + 19, step=30)], rank=rank)
    # Rank 2, gone from Redis and not seen for TRUST_SQL_AFTER_S, is judged from SQL.
    sweep_job(session=session, job_id=job_id(session), now=t + liveness.TRUST_SQL_AFTER_S + 6)
    session.commit()
    [incident] = incidents(client)
    assert (incident["kind"], incident["ranks"]) == ("crash", [2])


def test_the_sweep_writes_a_silent_ranks_last_state_to_sql(client, session, engine):
    start_job(client, ranks=2)
    post(client, [*steps(121, 130), beat(T0 + 130.5, inflight=WAITING)], rank=0)
    assert sql_rank(session, 0).last_step == 120  # still in Redis only

    quiet = time.time() + liveness.QUIET_S + 1  # rank 0 has been silent for QUIET_S
    with rank_writes(engine) as writes:
        assert liveness.flush_quiet(session=session, job_id=job_id(session), now=quiet) == 1
        session.commit()  # then Redis learns that SQL holds it
        assert len(writes) == 1, "one statement for all the ranks flushed"
        assert liveness.flush_quiet(session=session, job_id=job_id(session), now=quiet) == 0
    row = sql_rank(session, 0)
    assert (row.last_step, row.last_heartbeat_ts) == (130, T0 + 130.5)
    assert row.inflight == WAITING


def test_the_sweep_brings_back_no_rank_sql_does_not_know(client, session):
    start_job(client, ranks=2)
    jid = job_id(session)
    ghost = rank_values(
        job_id=jid, rank=9, host="gone", attempt=0, by_type={"heartbeat": [beat(T0)]}
    )
    live = liveness.store()
    assert live is not None
    live.record(ghost, now=time.time() - 60)  # left in Redis by a database since reset
    assert liveness.flush_quiet(session=session, job_id=jid, now=time.time()) == 0
    shown = [r["rank"] for r in client.get(f"/api/v1/jobs/{JOB}/ranks", headers=ADMIN).json()]
    assert shown == [0, 1]


def test_an_active_ranks_row_is_refreshed_every_sql_refresh_s(client, session, engine):
    post(client, [*steps(0, 1), beat(T0 + 1.5)], rank=0)
    session.commit()
    jid, now = job_id(session), time.time()

    def record(ts: float, at: float) -> None:
        values = rank_values(
            job_id=jid, rank=0, host="node-1", attempt=0, by_type={"heartbeat": [beat(ts)]}
        )
        liveness.record_rank(session=session, values=values, now=at)
        session.commit()

    with rank_writes(engine) as writes:
        record(T0 + 2, now + 1)
        record(T0 + 3, now + liveness.SQL_REFRESH_S - 1)
        assert len(writes) == 0
        record(T0 + 4, now + liveness.SQL_REFRESH_S + 1)
        assert len(writes) == 1
        record(T0 + 5, now + liveness.SQL_REFRESH_S + 2)
        assert len(writes) == 1
    assert sql_rank(session, 0).last_heartbeat_ts == T0 + 4
