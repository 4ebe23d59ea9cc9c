"""Against a real server process: concurrent retries of one batch are stored once, and
concurrent ranks of one job all land."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from sqlalchemy import func, select

from backend.db import make_engine
from backend.telemetry.models import StepRecord
from tests.conftest import BACKENDS, INGEST, backend_url
from tests.factories import batch, step
from tests.servers import live_server


@pytest.fixture(params=BACKENDS)
def server_db(request, tmp_path_factory):  # type: ignore[no-untyped-def]
    return backend_url(request.param, tmp_path_factory, suffix="live")


def stored_steps(url: str) -> int:
    engine = make_engine(url)
    with engine.connect() as conn:
        n = conn.scalar(select(func.count()).select_from(StepRecord))
    engine.dispose()
    return int(n or 0)


def test_concurrent_duplicates_and_ranks(server_db):
    same = batch([step(n) for n in range(50)], rank=0, world_size=8)
    ranks = [batch([step(n) for n in range(50)], rank=r, world_size=8) for r in range(1, 8)]
    with live_server(server_db) as base, httpx.Client(base_url=base, timeout=30) as client:

        def post(body):  # type: ignore[no-untyped-def]
            return client.post("/api/v1/ingest", json=body, headers=INGEST).json()

        with ThreadPoolExecutor(8) as pool:
            replies = list(pool.map(post, [same] * 8 + ranks))
    dup_replies = replies[:8]
    assert sorted(r["duplicate"] for r in dup_replies) == [False] + [True] * 7
    assert all(r["accepted"] == 50 for r in replies)
    assert stored_steps(server_db) == 8 * 50
