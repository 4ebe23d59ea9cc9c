"""Fixtures of the ingest tests."""

from __future__ import annotations

import pytest

from backend.api import create_app


@pytest.fixture
def busy_app(settings, engine, session_factory):  # type: ignore[no-untyped-def]
    """An app whose ingest gate is full (2 of 2 slots held by the test); the heartbeat lane
    has 1 slot."""
    limited = settings.model_copy(update={"max_inflight_ingest": 2, "max_inflight_liveness": 1})
    app = create_app(limited, engine=engine, session_factory=session_factory)
    gate = app.state.ingest_gate
    assert gate.try_enter() and gate.try_enter()
    yield app
    gate.leave()
    gate.leave()
