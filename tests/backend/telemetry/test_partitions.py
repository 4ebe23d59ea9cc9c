"""Raw telemetry in day partitions (PostgreSQL): ingest lands every batch, whatever its
clock; the detectors' and pages' queries still go by the indexes, and a time-bounded
query reads only its days; retention drops whole old days and keeps the rollups. SQLite
keeps plain tables: ingest as before, retention a no-op."""

from __future__ import annotations

import time
from typing import Any

import pytest
from sqlalchemy import func, select, text
from sqlalchemy.orm import Session

from backend.celery_app import configure
from backend.telemetry import partitions
from backend.telemetry.models import CollectiveRecord, CollectiveRollup, StepRecord, StepRollup
from backend.telemetry.partitions import DAY_S, day_of, partition_name
from backend.telemetry.retention import maintain, raw_retention
from tests.conftest import INGEST
from tests.factories import batch, step

NOW = time.time()
TODAY = day_of(NOW)


def collective(n: int) -> dict[str, Any]:
    return {
        "type": "collective",
        "step": n,
        "group": "dp",
        "op": "all_reduce",
        "seq": n,
        "bytes": 4096,
        "duration_s": 0.01,
        "count": 1,
    }


def ingest(client, events: list[dict[str, Any]], **fields: Any) -> None:  # type: ignore[no-untyped-def]
    reply = client.post("/api/v1/ingest", json=batch(events, **fields), headers=INGEST)
    assert reply.status_code == 200, reply.text


def stored_in(session: Session, table: str) -> dict[int, str]:
    """{step: partition} of ``table``'s rows (the table itself on SQLite)."""
    if session.get_bind().dialect.name != "postgresql":
        return {int(s): table for s in session.scalars(text(f"SELECT step FROM {table}"))}
    found = session.execute(text(f"SELECT step, tableoid::regclass::text FROM {table}"))
    return {int(s): str(p) for s, p in found}


def test_ingest_lands_batches_of_any_clock(client, session):
    """Now, a clock 56 years behind and one 250 years ahead: all stored, the far ones in
    DEFAULT; a collective goes by the server's clock, so it lands in today's day."""
    now = time.time()  # not the module's NOW: a suite may pass midnight before this test
    ingest(client, [step(1, ts=now), step(2, ts=1000.0), step(3, ts=9.9e9), collective(1)])
    ingest(client, [step(4, ts=now + 1), collective(4)], rank=1)
    steps, colls = stored_in(session, "steps"), stored_in(session, "collectives")
    server_ts = list(session.scalars(select(CollectiveRecord.ts)))
    if session.get_bind().dialect.name == "postgresql":
        assert steps == {
            1: partition_name("steps", day_of(now)),
            2: "steps_default",
            3: "steps_default",
            4: partition_name("steps", day_of(now + 1)),
        }
        assert set(colls.values()) == {partition_name("collectives", day_of(t)) for t in server_ts}
    else:
        assert set(steps) == {1, 2, 3, 4}
    assert set(colls) == {1, 4}
    for ts in server_ts:
        assert now - 60 < ts < time.time() + 60


def fill(session: Session, days: list[int], jobs: int = 12, ranks: int = 4, steps: int = 400):
    """Steps and collectives of ``jobs`` jobs, ``steps`` steps a day over ``days``."""
    for i, day in enumerate(days):
        params = {
            "jobs": jobs,
            "ranks": ranks,
            "steps": steps,
            "first": i * steps,
            "t0": day * DAY_S,
        }
        session.execute(
            text(
                "INSERT INTO steps (job_id, rank, attempt, step, ts, duration_s) "
                "SELECT j, r, 0, :first + s, :t0 + s * 60, 0.3 FROM generate_series(1, :jobs) j, "
                "generate_series(0, :ranks - 1) r, generate_series(0, :steps - 1) s"
            ),
            params,
        )
        session.execute(
            text(
                'INSERT INTO collectives (job_id, rank, attempt, step, "group", op, bytes, '
                "duration_s, count, ts) SELECT j, r, 0, :first + s, 'dp', 'all_reduce', 4096, "
                "0.01, 1, :t0 + s * 60 FROM generate_series(1, :jobs) j, "
                "generate_series(0, :ranks - 1) r, generate_series(0, :steps - 1) s"
            ),
            params,
        )
    session.execute(text("ANALYZE steps"))
    session.execute(text("ANALYZE collectives"))


def scans(session: Session, sql: str, **params: Any) -> dict[str, set[str]]:
    """{relation: node types that read it} in the plan of ``sql``."""
    plan = session.execute(text(f"EXPLAIN (FORMAT JSON) {sql}"), params).scalar_one()
    found: dict[str, set[str]] = {}

    def walk(node: dict[str, Any]) -> None:
        if "Relation Name" in node:
            found.setdefault(node["Relation Name"], set()).add(node["Node Type"])
        for child in node.get("Plans", []):
            walk(child)

    walk(plan[0]["Plan"])
    return found


INDEXED = {"Index Scan", "Index Only Scan", "Bitmap Heap Scan"}
# The shapes of the detectors' window reads (backend.detection.window) and of the pages'
# per-rank step reads (backend.telemetry.queries, backend.jobs.service).
BY_STEP = {
    "detector step window": "SELECT rank, step, duration_s FROM steps "
    "WHERE job_id = :job AND attempt = 0 AND step >= :step",
    "detector collective window": "SELECT rank, step, bytes, duration_s FROM collectives "
    "WHERE job_id = :job AND attempt = 0 AND step >= :step",
    "page: one rank's steps": "SELECT step, duration_s FROM steps "
    "WHERE job_id = :job AND rank = 2 ORDER BY step, rank, id LIMIT 100",
}


def test_queries_use_the_indexes_and_a_time_bound_prunes(session):
    if session.get_bind().dialect.name != "postgresql":
        pytest.skip("partitions are PostgreSQL's")
    conn = session.connection()
    days = [TODAY - 2, TODAY - 1, TODAY]
    for day in days[:2]:
        partitions.add_day(conn, "steps", day)
        partitions.add_day(conn, "collectives", day)
    fill(session, days)
    for table in ("steps", "collectives"):
        filled = {partition_name(table, d) for d in days}
        for what, sql in BY_STEP.items():
            if f"FROM {table} " not in sql:
                continue
            plan = scans(session, sql, job=5, step=700)
            read = {p: nodes for p, nodes in plan.items() if p in filled}
            assert read, (what, plan)
            assert all(nodes <= INDEXED for nodes in read.values()), (what, plan)
        # Ten minutes of yesterday: only yesterday's partition is read.
        lo = (TODAY - 1) * DAY_S + 3600
        plan = scans(
            session,
            f"SELECT count(*) FROM {table} WHERE job_id = :job AND ts >= :lo AND ts < :hi",
            job=5,
            lo=lo,
            hi=lo + 600,
        )
        assert set(plan) == {partition_name(table, TODAY - 1)}, plan


def count(session: Session, model: Any) -> int:
    return int(session.scalar(select(func.count()).select_from(model)) or 0)


def test_retention_drops_whole_old_days_and_keeps_rollups(client, session, session_factory):
    postgres = session.get_bind().dialect.name == "postgresql"
    old = {"20 days": NOW - 20 * DAY_S, "15 days": NOW - 15 * DAY_S, "13 days": NOW - 13 * DAY_S}
    if postgres:
        conn = session.connection()
        for ts in old.values():
            partitions.add_day(conn, "steps", day_of(ts))
            partitions.add_day(conn, "collectives", day_of(ts))
        session.commit()
    # Steps of old days, of 5 days ago (no partition yet: DEFAULT), far past, and now.
    events = [step(i, ts=ts) for i, ts in enumerate(old.values())]
    events += [step(3, ts=NOW - 5 * DAY_S), step(4, ts=1000.0), step(5, ts=NOW)]
    events += [collective(i) for i in range(6)]
    ingest(client, events)
    session.execute(  # collectives of the old days (ingest stamps them with today)
        CollectiveRecord.__table__.update()
        .where(CollectiveRecord.step < 3)
        .values(
            ts=select(StepRecord.ts)
            .where(StepRecord.step == CollectiveRecord.step)
            .scalar_subquery()
        )
    )
    session.commit()
    rollups = (count(session, StepRollup), count(session, CollectiveRollup))
    assert rollups[0] > 0 and rollups[1] > 0

    report = maintain(factory=session_factory, retention_days=14, ahead_days=5, now=NOW)

    kept_steps = set(session.scalars(select(StepRecord.step)))
    kept_colls = set(session.scalars(select(CollectiveRecord.step)))
    assert (count(session, StepRollup), count(session, CollectiveRollup)) == rollups
    if not postgres:  # plain tables: nothing ages out
        assert report.made == report.dropped == []
        assert kept_steps == kept_colls == set(range(6))
        return
    dropped = {
        partition_name(t, day_of(old[d]))
        for t in ("steps", "collectives")
        for d in ("20 days", "15 days")
    }
    assert set(report.dropped) == dropped
    # 13 days old, moved out of DEFAULT, a far-past clock (kept in DEFAULT: acknowledged
    # rows never vanish for the date inside them), now
    assert kept_steps == {2, 3, 4, 5}
    assert stored_in(session, "steps")[4] == "steps_default"
    assert kept_colls == {2, 3, 4, 5}
    assert report.moved == 1 and report.failed == []
    assert stored_in(session, "steps")[3] == partition_name("steps", day_of(NOW - 5 * DAY_S))
    for day in range(TODAY, TODAY + 6):  # made ahead
        assert day in partitions.day_partitions(session.connection(), "steps")
    assert set(report.made) >= {partition_name("collectives", TODAY + 5)}

    again = maintain(factory=session_factory, retention_days=14, ahead_days=5, now=NOW)
    assert (again.made, again.dropped, again.moved) == ([], [], 0)


def test_a_partition_it_cannot_lock_in_time_waits_for_the_next_run(
    client, session, session_factory, engine
):
    """An insert into DEFAULT that stays open (a slow ingest transaction) holds the day's
    partition back: the run gives up on it after the lock timeout, says so, loses no row,
    and the next run makes it."""
    if session.get_bind().dialect.name != "postgresql":
        pytest.skip("partitions are PostgreSQL's")
    ingest(client, [step(1, ts=NOW - 5 * DAY_S)])
    day = partition_name("steps", day_of(NOW - 5 * DAY_S))
    with engine.connect() as other:
        other.execute(text("LOCK TABLE steps_default IN ROW EXCLUSIVE MODE"))
        blocked = maintain(factory=session_factory, retention_days=14, now=NOW)
        other.rollback()
    assert blocked.failed == [f"make {day}"] and day not in blocked.made
    assert stored_in(session, "steps") == {1: "steps_default"}
    again = maintain(factory=session_factory, retention_days=14, now=NOW)
    assert again.made == [day] and again.failed == []
    assert stored_in(session, "steps") == {1: day}


def test_the_beat_task_goes_by_the_setting(client, session, session_factory, settings):
    if session.get_bind().dialect.name != "postgresql":
        # Embedded mode's ticker runs it too: on SQLite it keeps every row.
        ingest(client, [step(1, ts=1000.0)])
        configure(settings.model_copy(update={"raw_retention_days": 14}), session_factory)
        try:
            raw_retention()
        finally:
            configure(settings, session_factory)
        assert count(session, StepRecord) == 1
        return
    old_day = TODAY - 30
    partitions.add_day(session.connection(), "steps", old_day)
    session.commit()
    try:
        configure(settings.model_copy(update={"raw_retention_days": 0}), session_factory)
        raw_retention()  # 0: raw rows are kept for ever
        assert old_day in partitions.day_partitions(session.connection(), "steps")
        configure(settings.model_copy(update={"raw_retention_days": 14}), session_factory)
        raw_retention()
        assert old_day not in partitions.day_partitions(session.connection(), "steps")
    finally:
        configure(settings, session_factory)
