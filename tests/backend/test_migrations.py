"""Alembic: `upgrade head` builds the schema the models describe, and back down again."""

from __future__ import annotations

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect

from backend.db import make_engine
from backend.migrate import current_revision, head_revision, upgrade
from backend.models import Base
from backend.telemetry.partitions import include_name
from tests.conftest import BACKENDS, backend_url


@pytest.fixture(params=BACKENDS)
def fresh_url(request, tmp_path_factory):  # type: ignore[no-untyped-def]
    return backend_url(request.param, tmp_path_factory, suffix="migrations")


def test_upgrade_head_has_no_drift_from_the_models(fresh_url):
    upgrade(fresh_url)
    engine = make_engine(fresh_url)
    try:
        assert current_revision(engine) == head_revision()
        with engine.connect() as conn:
            opts = {"compare_type": True, "include_name": include_name}
            ctx = MigrationContext.configure(conn, opts=opts)
            diff = compare_metadata(ctx, Base.metadata)
        assert diff == [], f"models and migrations differ: {diff}"
    finally:
        engine.dispose()


def test_downgrade_to_base_and_up_again(fresh_url):
    from alembic import command

    from backend.migrate import alembic_config

    upgrade(fresh_url)
    command.downgrade(alembic_config(fresh_url), "base")
    engine = make_engine(fresh_url)
    try:
        assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
        upgrade(fresh_url)
        assert set(Base.metadata.tables) <= set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_revisions_have_real_messages():
    from alembic.script import ScriptDirectory

    from backend.migrate import alembic_config

    for rev in ScriptDirectory.from_config(alembic_config()).walk_revisions():
        assert rev.doc and rev.doc.lower() not in ("empty message", ""), rev.revision


def test_0010_scopes_batch_ids_to_their_job_and_back(fresh_url):
    """Stored batches survive the key change both ways; going back, of a batch_id two jobs
    share the lowest job's row is kept (the old key allows one)."""
    from alembic import command
    from sqlalchemy import text

    from backend.migrate import alembic_config

    config = alembic_config(fresh_url)
    command.upgrade(config, "0009")
    engine = make_engine(fresh_url)
    now = "2026-11-26 00:00:00+00:00"
    try:
        with engine.begin() as conn:
            for job_id in (1, 2):
                conn.execute(
                    text(
                        "INSERT INTO jobs (id, name, kind, world_size, attempt, created_at) "
                        "VALUES (:id, :name, 'training', 1, 0, :now)"
                    ),
                    {"id": job_id, "name": f"job-{job_id}", "now": now},
                )
            conn.execute(
                text(
                    "INSERT INTO ingest_batches (batch_id, job_id, rank, events, received_at) "
                    "VALUES ('b-1', 1, 0, 3, :now)"
                ),
                {"now": now},
            )
        command.upgrade(config, "head")
        assert inspect(engine).get_pk_constraint("ingest_batches")["constrained_columns"] == [
            "job_id",
            "batch_id",
        ]
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO ingest_batches (batch_id, job_id, rank, events, received_at, "
                    "content_hash) VALUES ('b-1', 2, 0, 1, :now, 'ab')"
                ),
                {"now": now},
            )
        command.downgrade(config, "0009")
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT batch_id, job_id, events FROM ingest_batches"))
            assert [tuple(r) for r in rows] == [("b-1", 1, 3)]
        assert inspect(engine).get_pk_constraint("ingest_batches")["constrained_columns"] == [
            "batch_id"
        ]
    finally:
        engine.dispose()
