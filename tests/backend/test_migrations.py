"""Alembic: `upgrade head` builds the schema the models describe, and back down again."""

from __future__ import annotations

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect

from backend.db import make_engine
from backend.migrate import current_revision, head_revision, upgrade
from backend.models import Base
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
            ctx = MigrationContext.configure(conn, opts={"compare_type": True})
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
