"""``/readyz`` (readiness of the pipeline) next to ``/healthz`` (liveness), embedded mode:
ready while the in-process ticker runs, 503 with the reason when it does not or when a
detection request waits too long; the same figures in ``/metrics``. (Distributed mode, with
real workers, beat and restarts, is tests/reliability/.)"""

from __future__ import annotations

from fastapi.testclient import TestClient

from backend.api import create_app
from tests.conftest import ADMIN, INGEST
from tests.factories import batch, step


def make_app(settings, engine, session_factory, **changes):  # type: ignore[no-untyped-def]
    changed = settings.model_copy(update={"detect_interval_s": 60, **changes})
    return create_app(changed, engine=engine, session_factory=session_factory)


def test_ready_while_the_ticker_runs(settings, engine, session_factory):
    app = make_app(settings, engine, session_factory)
    with TestClient(app) as client:  # the lifespan starts the ticker
        reply = client.get("/readyz")
        assert reply.status_code == 200, reply.text
        body = reply.json()
        assert body["status"] == "ready" and body["mode"] == "embedded"
        assert body["workers"] == 1 and body["beat"] == 1 and body["reasons"] == []
        metrics = client.get("/metrics", headers=ADMIN).text
        assert "vigil_worker_alive 1.0" in metrics
        assert "vigil_detection_lag_seconds 0.0" in metrics


def test_not_ready_without_the_ticker_though_alive(settings, engine, session_factory):
    client = TestClient(make_app(settings, engine, session_factory))  # no lifespan: no ticker
    assert client.get("/healthz").status_code == 200
    reply = client.get("/readyz")
    assert reply.status_code == 503
    assert reply.json()["reasons"] == ["the in-process ticker is not running"]


def test_not_ready_when_detection_lags(settings, engine, session_factory):
    app = make_app(settings, engine, session_factory, ready_max_lag_s=0.001)
    with TestClient(app) as client:
        reply = client.post("/api/v1/ingest", json=batch([step(1)]), headers=INGEST)
        assert reply.status_code == 200, reply.text
        body = client.get("/readyz").json()
        assert body["status"] == "not ready" and body["pending_jobs"] == 1
        assert body["reasons"][0].startswith("detection lag")
        assert body["detection_lag_s"] > 0
