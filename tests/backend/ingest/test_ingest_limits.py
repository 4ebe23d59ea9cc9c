"""Size limits (413) and admission control (429 with Retry-After)."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from backend.api import create_app
from tests.conftest import INGEST
from tests.factories import batch, step


@pytest.fixture
def small_app(settings, engine, session_factory):  # type: ignore[no-untyped-def]
    limited = settings.model_copy(
        update={"max_body_bytes": 4096, "max_events_per_batch": 10, "max_inflight_ingest": 2}
    )
    return create_app(limited, engine=engine, session_factory=session_factory)


def test_body_over_the_limit_is_413(small_app):
    body = json.dumps(batch([step(n) for n in range(40)]))
    assert len(body) > 4096
    with TestClient(small_app) as client:
        reply = client.post(
            "/api/v1/ingest", content=body, headers={**INGEST, "Content-Type": "application/json"}
        )
    assert reply.status_code == 413
    assert "4096-byte limit" in reply.json()["detail"]


def test_too_many_events_is_413_naming_the_limit(small_app):
    with TestClient(small_app) as client:
        reply = client.post(
            "/api/v1/ingest", json=batch([step(n) for n in range(11)]), headers=INGEST
        )
    assert reply.status_code == 413
    assert "limit of 10 per batch" in reply.json()["detail"]


def test_saturated_server_replies_429_with_retry_after(small_app):
    gate = small_app.state.ingest_gate
    # Two batches are "in flight" (held by this test): the server is at its limit.
    assert gate.try_enter() and gate.try_enter()
    with TestClient(small_app) as client:
        busy = client.post("/api/v1/ingest", json=batch([step(1)]), headers=INGEST)
        assert busy.status_code == 429
        assert int(busy.headers["retry-after"]) >= 1
        gate.leave()
        ok = client.post("/api/v1/ingest", json=batch([step(1)]), headers=INGEST)
        assert ok.status_code == 200
    gate.leave()
    assert not gate._inflight
