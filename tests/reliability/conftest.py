"""Fault-injection fixtures: private services a test may restart or kill
(``tests.reliability.services``); the live Vigil they run is ``tests.reliability.stack``.

Nothing here touches the machine's shared PostgreSQL or Redis: each test gets its own
``redis-server`` and PostgreSQL cluster on free ports, in a temporary directory, so it can
restart or kill them at will. Where the binaries are missing the tests skip, visibly; where
a test does not restart a service, the shared one named by ``VIGIL_TEST_DATABASE_URL`` /
``VIGIL_TEST_REDIS_URL`` is the fallback.

    def test_x(tmp_path, redis_server, pg_server):
        stack = VigilStack(tmp_path, db_url=pg_server.url, redis_url=redis_server.url)
        stack.start_worker(); stack.start_beat(); stack.start_server()
        redis_server.restart()           # same port, contents lost (no persistence)
        stack.kill9("worker")            # SIGKILL the worker and its pool children
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from backend.migrate import upgrade
from tests.conftest import backend_url
from tests.reliability.services import (
    REDIS_SERVER,
    PostgresServer,
    RedisServer,
    private_postgres_missing,
)


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A private Redis the test may restart or kill."""
    if REDIS_SERVER is None:
        pytest.skip("needs the redis-server binary (apt-get install redis-server)")
    server = RedisServer(tmp_path)
    server.start()
    yield server
    server.stop(kill=True)


@pytest.fixture
def reliability_redis(request: pytest.FixtureRequest) -> str:
    """A Redis URL for a test that does not restart Redis: a private one where the binary
    exists, else ``VIGIL_TEST_REDIS_URL`` (its database is flushed: it belongs to tests)."""
    if REDIS_SERVER is not None:
        server: RedisServer = request.getfixturevalue("redis_server")
        return server.url
    shared = os.environ.get("VIGIL_TEST_REDIS_URL")
    if not shared:
        pytest.skip("needs Redis: the redis-server binary or VIGIL_TEST_REDIS_URL")
    from redis import Redis

    client = Redis.from_url(shared, socket_connect_timeout=2)
    client.flushdb()
    client.close()
    return shared


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[PostgresServer]:
    """One private PostgreSQL cluster for the session (initdb costs seconds)."""
    missing = private_postgres_missing()
    if missing:
        pytest.skip(missing)
    server = PostgresServer()
    server.start()
    yield server
    server.destroy()


@pytest.fixture
def pg_server(pg_cluster: PostgresServer) -> PostgresServer:
    """The private cluster with an empty, migrated ``vigil`` database; restartable."""
    if not pg_cluster.running():  # a test that stopped it and failed before restarting
        pg_cluster.start()
    pg_cluster.create_database()
    upgrade(pg_cluster.url)
    return pg_cluster


@pytest.fixture
def reliability_db(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A migrated PostgreSQL database several processes share (the test does not restart
    it): on the private cluster where one can run, else a sibling of
    ``VIGIL_TEST_DATABASE_URL`` (``<name>_reliability``)."""
    if private_postgres_missing() is None:
        server: PostgresServer = request.getfixturevalue("pg_server")
        return server.url
    url = backend_url("postgres", tmp_path_factory, suffix="reliability")  # skips without
    upgrade(url)
    return url
