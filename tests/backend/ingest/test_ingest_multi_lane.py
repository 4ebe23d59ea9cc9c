"""The heartbeat lane on ``/api/v1/ingest/multi`` (a per-host relay's endpoint): when the
ingest gate is full, a relay's request of heartbeat-only lines still gets in, so overload
does not silence a whole node of live ranks at once; a request with telemetry in it gets
429 as a whole. ``busy_app`` (conftest): the gate's slots are held by the test."""

from __future__ import annotations

import gzip
import json

from fastapi.testclient import TestClient

from tests.conftest import ADMIN, INGEST
from tests.factories import batch, step

NOW = 1_732_233_000.0
NODE = 8
NDJSON = {**INGEST, "Content-Type": "application/x-ndjson"}
GZIP = {**NDJSON, "Content-Encoding": "gzip"}


def beat(rank: int, ts: float = NOW, **fields: object) -> bytes:
    event = {"type": "heartbeat", "ts": ts, "step": 12, **fields}
    return json.dumps(batch([event], rank=rank, world_size=NODE)).encode()


def multi(client: TestClient, lines: list[bytes], headers: dict[str, str] = GZIP):  # type: ignore[no-untyped-def]
    body = b"\n".join(lines)
    if headers.get("Content-Encoding") == "gzip":
        body = gzip.compress(body)
    return client.post("/api/v1/ingest/multi", content=body, headers=headers)


def test_a_nodes_heartbeats_get_in_while_its_telemetry_is_refused(busy_app):
    beats = [beat(r) for r in range(NODE - 1)]
    beats.append(beat(NODE - 1, exiting=True, exit_code=0))  # a goodbye is a heartbeat too
    telemetry = json.dumps(batch([step(11), {"type": "heartbeat", "ts": NOW}], rank=0))
    with TestClient(busy_app) as client:
        refused = multi(client, [beat(0, NOW - 1), telemetry.encode()])
        assert refused.status_code == 429, refused.text
        assert int(refused.headers["retry-after"]) >= 1
        alive = multi(client, beats)
        assert alive.status_code == 200, alive.text
        results = alive.json()["results"]
        assert [r["status"] for r in results] == [200] * NODE
        assert all(r["accepted"] == 1 for r in results)
        plain = multi(client, [beat(0, NOW + 1)], NDJSON)  # uncompressed counts the same
        assert plain.status_code == 200, plain.text
        listed = client.get("/api/v1/jobs/llama-8b-pretrain/ranks", headers=ADMIN).json()
    ranks = {r["rank"]: r for r in listed}
    assert sorted(ranks) == list(range(NODE))
    assert ranks[0]["last_heartbeat_ts"] == NOW + 1
    assert all(ranks[r]["last_heartbeat_ts"] == NOW for r in range(1, NODE))
    assert ranks[0]["last_step"] is None  # the refused request left nothing behind
    assert ranks[NODE - 1]["exited"] is True
    assert busy_app.state.liveness_gate._inflight == 0


def test_the_lane_takes_only_small_heartbeat_only_requests(busy_app):
    from collector.lane import MAX_BYTES, MAX_EVENTS, MULTI_MAX_BYTES, MULTI_MAX_LINES

    many_events = [{"type": "heartbeat", "ts": NOW + i / 100} for i in range(MAX_EVENTS + 1)]
    spaces = MAX_BYTES - 1024  # JSON whitespace: a valid batch, however long
    lines_over = MULTI_MAX_BYTES // spaces + 1
    refused = {
        "too many lines": [beat(r % NODE) for r in range(MULTI_MAX_LINES + 1)],
        "too many bytes": [beat(r) + b" " * spaces for r in range(lines_over)],
        "a line too big": [beat(0) + b" " * MAX_BYTES],
        "a line of too many events": [json.dumps(batch(many_events)).encode()],
        "a line that is no batch": [beat(1), b"[1, 2]"],
    }
    with TestClient(busy_app) as client:
        for why, lines in refused.items():
            for headers in (GZIP, NDJSON):
                reply = multi(client, lines, headers)
                assert reply.status_code == 429, (why, headers, reply.text)
        lane = busy_app.state.liveness_gate
        assert lane._inflight == 0
        assert lane.try_enter()  # the lane's one slot is taken: the lane is full too
        try:
            assert multi(client, [beat(0)]).status_code == 429
        finally:
            lane.leave()
        assert multi(client, [beat(0)]).status_code == 200
