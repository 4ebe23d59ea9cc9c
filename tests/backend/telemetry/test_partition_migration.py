"""Migration 0014 both ways, with rows: on PostgreSQL ``steps`` and ``collectives`` become
day-partitioned tables (DEFAULT for far clocks, key ``(id, ts)``, BRIN on ``ts``) and plain
again, every row kept and the id sequences still theirs; on SQLite only
``collectives.ts`` comes and goes."""

from __future__ import annotations

import time

import pytest
from alembic import command
from sqlalchemy import Engine, inspect, text

from backend.db import make_engine
from backend.migrate import alembic_config
from backend.telemetry.partitions import DAY_S, day_of, partition_name
from tests.conftest import BACKENDS, backend_url

NOW = time.time()
# A step per clock: 20 days ago, now, a clock far in the past and one far in the future.
STEP_TS = {1: NOW - 20 * DAY_S, 2: NOW, 3: 1000.0, 4: 9.9e9}
STEP_COLS = "id, job_id, rank, attempt, step, ts, duration_s, loss"
COLL_COLS = 'id, job_id, rank, attempt, step, "group", op, seq, bytes, duration_s, count'


@pytest.fixture(params=BACKENDS)
def fresh_url(request, tmp_path_factory):  # type: ignore[no-untyped-def]
    return backend_url(request.param, tmp_path_factory, suffix="partition_migration")


def rows(engine: Engine, sql: str) -> list[tuple[object, ...]]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text(sql))]


def where(engine: Engine, table: str) -> dict[int, str]:
    """The partition each row of ``table`` is stored in: {id: partition name}."""
    found = rows(engine, f"SELECT id, tableoid::regclass::text FROM {table}")
    return {int(i): str(p) for i, p in found}  # type: ignore[call-overload]


def insert_new_rows(engine: Engine, *, step: int) -> None:
    """Rows without an id, as ingest writes them: the id sequence must still serve."""
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO steps (job_id, rank, attempt, step, ts, duration_s) "
                "VALUES (1, 0, 0, :step, :ts, 0.5)"
            ),
            {"step": step, "ts": NOW},
        )
        conn.execute(
            text(
                'INSERT INTO collectives (job_id, rank, attempt, step, "group", op, bytes, '
                "duration_s, count) VALUES (1, 0, 0, :step, 'dp', 'all_reduce', 8, 0.1, 1)"
            ),
            {"step": step},
        )


def test_0014_partitions_raw_telemetry_and_back_keeping_every_row(fresh_url):
    config = alembic_config(fresh_url)
    command.upgrade(config, "0013")
    engine = make_engine(fresh_url)
    postgres = engine.dialect.name == "postgresql"
    try:
        with engine.begin() as conn:
            for step, ts in STEP_TS.items():
                conn.execute(
                    text(
                        "INSERT INTO steps (id, job_id, rank, attempt, step, ts, duration_s, "
                        "loss) VALUES (:id, 1, 0, 0, :step, :ts, 0.5, 2.0)"
                    ),
                    {"id": step, "step": step, "ts": ts},
                )
            # Collectives of steps 1, 2 and 4, and one of a step never reported (9).
            for cid, step in ((1, 1), (2, 2), (3, 4), (4, 9)):
                conn.execute(
                    text(
                        'INSERT INTO collectives (id, job_id, rank, attempt, step, "group", op, '
                        "seq, bytes, duration_s, count) "
                        "VALUES (:id, 1, 0, 0, :step, 'dp', 'all_reduce', :id, 1024, 0.1, 2)"
                    ),
                    {"id": cid, "step": step},
                )
            if postgres:  # as ingest leaves them: the sequences ahead of the ids
                conn.execute(text("SELECT setval('steps_id_seq', 4)"))
                conn.execute(text("SELECT setval('collectives_id_seq', 4)"))
        steps_before = rows(engine, f"SELECT {STEP_COLS} FROM steps ORDER BY id")
        colls_before = rows(engine, f"SELECT {COLL_COLS} FROM collectives ORDER BY id")

        started = time.time()
        command.upgrade(config, "0014")
        assert rows(engine, f"SELECT {STEP_COLS} FROM steps ORDER BY id") == steps_before
        assert rows(engine, f"SELECT {COLL_COLS} FROM collectives ORDER BY id") == colls_before
        coll_ts = dict(rows(engine, "SELECT id, ts FROM collectives"))  # type: ignore[arg-type]
        if postgres:
            # A collective takes its step's time; one without a reported step, the migration's.
            assert [coll_ts[1], coll_ts[2], coll_ts[3]] == [STEP_TS[1], STEP_TS[2], STEP_TS[4]]
            assert started - 1 <= coll_ts[4] <= time.time() + 1
            assert where(engine, "steps") == {
                1: partition_name("steps", day_of(STEP_TS[1])),
                2: partition_name("steps", day_of(NOW)),
                3: "steps_default",
                4: "steps_default",
            }
            assert where(engine, "collectives")[1] == partition_name(
                "collectives", day_of(STEP_TS[1])
            )
            inspector = inspect(engine)
            for table in ("steps", "collectives"):
                assert inspector.get_pk_constraint(table)["constrained_columns"] == ["id", "ts"]
            kinds = dict(
                rows(
                    engine,
                    "SELECT relname, relkind FROM pg_class WHERE relname IN "
                    "('steps', 'collectives', 'brin_steps_ts', "
                    "'brin_collectives_ts')",
                )
            )
            assert kinds == {
                "steps": "p",
                "collectives": "p",
                "brin_steps_ts": "I",  # a partitioned index: one BRIN per partition
                "brin_collectives_ts": "I",
            }
            ahead = partition_name("steps", day_of(NOW) + 3)
            assert rows(engine, f"SELECT to_regclass('{ahead}') IS NOT NULL") == [(True,)]
        else:
            assert all(started - 1 <= ts <= time.time() + 1 for ts in coll_ts.values())

        insert_new_rows(engine, step=5)
        after_up = rows(engine, f"SELECT {STEP_COLS} FROM steps ORDER BY id")
        assert [r[0] for r in after_up] == [1, 2, 3, 4, 5]
        colls_up = rows(engine, f"SELECT {COLL_COLS} FROM collectives ORDER BY id")
        assert [r[0] for r in colls_up] == [1, 2, 3, 4, 5]

        command.downgrade(config, "0013")
        assert rows(engine, f"SELECT {STEP_COLS} FROM steps ORDER BY id") == after_up
        assert rows(engine, f"SELECT {COLL_COLS} FROM collectives ORDER BY id") == colls_up
        inspector = inspect(engine)
        assert "ts" not in {c["name"] for c in inspector.get_columns("collectives")}
        assert inspector.get_pk_constraint("steps")["constrained_columns"] == ["id"]
        if postgres:
            assert rows(engine, "SELECT relkind FROM pg_class WHERE relname = 'steps'") == [("r",)]
            assert rows(engine, "SELECT count(*) FROM pg_class WHERE relname LIKE 'steps_p%'") == [
                (0,)
            ]
            insert_new_rows(engine, step=6)  # the sequences came back with their tables
            assert rows(engine, "SELECT max(id) FROM steps") == [(6,)]
            assert rows(engine, "SELECT max(id) FROM collectives") == [(6,)]

        command.upgrade(config, "head")
        assert len(rows(engine, "SELECT id FROM steps")) == (6 if postgres else 5)
    finally:
        engine.dispose()
