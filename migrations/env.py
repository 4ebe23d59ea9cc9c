"""Alembic environment. The database URL comes from Vigil's settings (VIGIL_DATABASE_URL)
unless the caller put a connection or URL into the Alembic config."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from backend.db import make_engine
from backend.models import Base
from backend.settings import get_settings
from backend.telemetry.partitions import include_name

config = context.config
target_metadata = Base.metadata


def _configure(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        compare_type=True,
        include_name=include_name,  # partitions and BRIN indexes: PostgreSQL-only, not models
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection)
        return
    url = config.get_main_option("sqlalchemy.url") or get_settings().database_url
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            _configure(conn)
    finally:
        engine.dispose()


def run_migrations_offline() -> None:
    url = config.get_main_option("sqlalchemy.url") or get_settings().database_url
    context.configure(url=url, target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
