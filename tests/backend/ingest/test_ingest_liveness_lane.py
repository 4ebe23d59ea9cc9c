"""Overload must not silence live ranks: when the admission gate is full and telemetry gets
429, a small heartbeat-only batch (or a goodbye) still gets in, up to a limit of its own.
``busy_app`` (conftest): the gate's slots are held by the test."""

from __future__ import annotations

import gzip
import json

from fastapi.testclient import TestClient

from tests.conftest import ADMIN, INGEST
from tests.factories import batch, step

NOW = 1_732_233_000.0


def heartbeat(ts: float = NOW, **fields: object) -> dict[str, object]:
    return {"type": "heartbeat", "ts": ts, "step": 12, **fields}


def test_a_heartbeat_gets_in_while_telemetry_is_refused(busy_app):
    with TestClient(busy_app) as client:
        telemetry = client.post(
            "/api/v1/ingest", json=batch([step(11), heartbeat()], rank=1), headers=INGEST
        )
        assert telemetry.status_code == 429
        assert int(telemetry.headers["retry-after"]) >= 1
        alive = client.post("/api/v1/ingest", json=batch([heartbeat()], rank=1), headers=INGEST)
        assert alive.status_code == 200, alive.text
        assert alive.json()["accepted"] == 1
        goodbye = batch([heartbeat(NOW + 1, exiting=True, exit_code=0)], rank=2)
        body = gzip.compress(json.dumps(goodbye).encode())  # compressed counts the same
        bye = client.post(
            "/api/v1/ingest",
            content=body,
            headers={**INGEST, "Content-Type": "application/json", "Content-Encoding": "gzip"},
        )
        assert bye.status_code == 200, bye.text
        listed = client.get("/api/v1/jobs/llama-8b-pretrain/ranks", headers=ADMIN).json()
    ranks = {r["rank"]: r for r in listed}
    assert ranks[1]["last_heartbeat_ts"] == NOW
    assert ranks[1]["last_step"] is None  # the refused telemetry left nothing behind
    assert ranks[2]["exited"] is True


def test_the_heartbeat_lane_has_its_own_limit(busy_app):
    lane = busy_app.state.liveness_gate
    assert lane.try_enter()  # the lane's one slot is taken too
    try:
        with TestClient(busy_app) as client:
            refused = client.post("/api/v1/ingest", json=batch([heartbeat()]), headers=INGEST)
        assert refused.status_code == 429
    finally:
        lane.leave()


def test_only_small_heartbeat_only_batches_use_the_lane(busy_app):
    many = batch([heartbeat(NOW + i / 100) for i in range(100)])  # heartbeats, but not small
    with TestClient(busy_app) as client:
        assert client.post("/api/v1/ingest", json=many, headers=INGEST).status_code == 429
        named = batch([{"type": "event", "name": "checkpoint_saved", "ts": NOW}])
        assert client.post("/api/v1/ingest", json=named, headers=INGEST).status_code == 429
    assert busy_app.state.liveness_gate._inflight == 0
