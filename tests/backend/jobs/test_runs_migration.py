"""Migration 0012: every job stored before runs existed gets its first run, and nothing
that points at a job is lost going up or down (SQLite would rebuild ``jobs`` in batch
mode, and with foreign keys on, dropping it deletes every row that references it)."""

from __future__ import annotations

import pytest
from alembic import command
from sqlalchemy import text

from backend.db import make_engine
from backend.migrate import alembic_config
from tests.conftest import BACKENDS, backend_url

NOW = "2026-11-26 00:00:00+00:00"


@pytest.fixture(params=BACKENDS)
def fresh_url(request, tmp_path_factory):  # type: ignore[no-untyped-def]
    return backend_url(request.param, tmp_path_factory, suffix="runs_migration")


def test_0012_gives_each_job_its_first_run_and_goes_back(fresh_url):
    config = alembic_config(fresh_url)
    command.upgrade(config, "0011")
    engine = make_engine(fresh_url)
    try:
        with engine.begin() as conn:
            for job_id in (1, 2):
                conn.execute(
                    text(
                        "INSERT INTO jobs (id, name, kind, world_size, attempt, created_at) "
                        "VALUES (:id, :name, 'training', 4, 2, :now)"
                    ),
                    {"id": job_id, "name": f"job-{job_id}", "now": NOW},
                )
            conn.execute(
                text(
                    "INSERT INTO ingest_batches (batch_id, job_id, rank, events, received_at) "
                    "VALUES ('b-1', 1, 0, 3, :now)"
                ),
                {"now": NOW},
            )
        command.upgrade(config, "0012")
        with engine.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT jobs.id, runs.number, runs.key, runs.first_attempt, runs.state "
                    "FROM jobs JOIN runs ON runs.id = jobs.run_id ORDER BY jobs.id"
                )
            )
            assert [tuple(r) for r in rows] == [
                (1, 1, "run-1", 0, "running"),
                (2, 1, "run-1", 0, "running"),
            ]
        command.downgrade(config, "0011")
        with engine.connect() as conn:
            assert conn.scalar(text("SELECT count(*) FROM jobs")) == 2
            assert conn.scalar(text("SELECT count(*) FROM ingest_batches")) == 1
    finally:
        engine.dispose()
