"""Shared fixtures.

Database tests run on SQLite always and on PostgreSQL when ``VIGIL_TEST_DATABASE_URL`` is
set (the CI machine sets it); without it the Postgres variants are skipped, visibly.
The schema is created by Alembic (``upgrade head``) once per backend per session; each test
then runs inside a transaction that is rolled back.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from redis import Redis
from sqlalchemy import Connection, Engine, make_url, text
from sqlalchemy.orm import Session, sessionmaker

from backend.api import create_app
from backend.db import make_engine
from backend.migrate import upgrade
from backend.settings import Settings

PG_URL = os.environ.get("VIGIL_TEST_DATABASE_URL")
BACKENDS = ["sqlite", "postgres"]

ADMIN = {"Authorization": "Bearer vigil-dev-admin"}
INGEST = {"Authorization": "Bearer vigil-dev-ingest"}


def reset_postgres(url: str) -> None:
    """Empty the test database's public schema (it belongs to the tests)."""
    engine = make_engine(url)
    with engine.begin() as conn:
        conn.execute(text("DROP SCHEMA public CASCADE"))
        conn.execute(text("CREATE SCHEMA public"))
    engine.dispose()


def postgres_sibling(url: str, suffix: str) -> str:
    """A second database next to the test database, created empty if it is missing."""
    base = make_url(url)
    name = f"{base.database}_{suffix}"
    engine = make_engine(url)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        exists = conn.scalar(text("SELECT 1 FROM pg_database WHERE datname = :n"), {"n": name})
        if not exists:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    engine.dispose()
    return base.set(database=name).render_as_string(hide_password=False)


def backend_url(kind: str, tmp_path_factory: pytest.TempPathFactory, suffix: str = "") -> str:
    """An empty database of the given kind; ``suffix`` picks a separate Postgres database."""
    if kind == "sqlite":
        return f"sqlite:///{tmp_path_factory.mktemp('db') / 'vigil.db'}"
    if not PG_URL:
        pytest.skip("PostgreSQL tests need VIGIL_TEST_DATABASE_URL")
    url = Settings(database_url=PG_URL).database_url  # normalises the driver name
    if suffix:
        url = postgres_sibling(url, suffix)
    reset_postgres(url)
    return url


@pytest.fixture(scope="session", params=BACKENDS)
def db_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A migrated database, one per backend, shared by the session."""
    url = backend_url(request.param, tmp_path_factory)
    upgrade(url)
    return url


@pytest.fixture(scope="session")
def engine(db_url: str) -> Iterator[Engine]:
    engine = make_engine(db_url)
    yield engine
    engine.dispose()


@pytest.fixture
def connection(engine: Engine) -> Iterator[Connection]:
    """A connection in an outer transaction that is rolled back after the test."""
    conn = engine.connect()
    outer = conn.begin()
    yield conn
    outer.rollback()
    conn.close()


@pytest.fixture
def session_factory(connection: Connection) -> sessionmaker[Session]:
    # Sessions commit to a savepoint of the test's transaction, so services and views
    # behave as in production and the test still leaves nothing behind.
    return sessionmaker(
        bind=connection,
        join_transaction_mode="create_savepoint",
        expire_on_commit=False,
        autoflush=False,
    )


@pytest.fixture
def session(session_factory: sessionmaker[Session]) -> Iterator[Session]:
    with session_factory() as s:
        yield s


@pytest.fixture
def settings(db_url: str) -> Settings:
    # No background detection thread: it would share the test's connection.
    return Settings(database_url=db_url, env="development", token_cache_s=0, detect_interval_s=0)


@pytest.fixture
def app(settings: Settings, engine: Engine, session_factory: sessionmaker[Session]):  # type: ignore[no-untyped-def]
    return create_app(settings, engine=engine, session_factory=session_factory)


@pytest.fixture
def client(app) -> Iterator[TestClient]:  # type: ignore[no-untyped-def]
    with TestClient(app) as c:
        yield c


@pytest.fixture
def sqlite_url(tmp_path):  # type: ignore[no-untyped-def]
    """A fresh SQLite file for tests that start their own server process."""
    return f"sqlite:///{tmp_path / 'vigil.db'}"


@pytest.fixture
def redis_url() -> Iterator[str]:
    """``VIGIL_TEST_REDIS_URL``, emptied before and after the test (the test Redis database
    belongs to the tests); the test is skipped, visibly, without it."""
    url = os.environ.get("VIGIL_TEST_REDIS_URL")
    if not url:
        pytest.skip("needs VIGIL_TEST_REDIS_URL")
    client = Redis.from_url(url)
    client.flushdb()
    yield url
    client.flushdb()
    client.close()
