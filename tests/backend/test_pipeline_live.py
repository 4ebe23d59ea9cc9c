"""The whole pipeline in both ways to run, with real processes: a straggler is ingested,
detected, notified (Alertmanager and signed generic webhooks to a receiver the test
starts), then recovers and is notified as resolved.

- embedded: one ``vigil server`` (Celery eager, in-process ticker and sender);
- distributed: ``vigil server`` + a real ``vigil worker`` (Celery, prefork) + ``vigil beat``
  against the CI machine's Redis. The server runs no detection itself there, so every
  incident and notification proves the worker did its job.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import time

import httpx
import pytest

from backend.migrate import upgrade
from tests.conftest import ADMIN, INGEST, backend_url
from tests.factories import batch
from tests.servers import Receiver, live_server, vigil_env, vigil_process

REDIS_URL = os.environ.get("VIGIL_TEST_REDIS_URL")
JOB = "pipeline-straggler"
FAST = {
    "VIGIL_DETECT_INTERVAL_S": "0.3",
    "VIGIL_SWEEP_INTERVAL_S": "1",
    "VIGIL_WEBHOOK_BACKOFF_S": "0.2",
}


@pytest.fixture
def redis_url() -> str:
    if not REDIS_URL:
        pytest.skip("distributed-mode tests need VIGIL_TEST_REDIS_URL (a Redis to use)")
    from redis import Redis
    from redis.exceptions import RedisError

    client = Redis.from_url(REDIS_URL, socket_connect_timeout=2)
    try:
        client.ping()
    except RedisError as exc:
        pytest.skip(f"Redis at {REDIS_URL} does not answer: {exc}")
    client.flushdb()  # the test database number belongs to the tests
    return REDIS_URL


@pytest.fixture
def shared_db(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A database several processes share: Postgres when the CI has it, else SQLite."""
    kind = "postgres" if os.environ.get("VIGIL_TEST_DATABASE_URL") else "sqlite"
    url = backend_url(kind, tmp_path_factory, suffix="pipeline")
    upgrade(url)
    return url


def post_steps(base: str, steps: range, slow_rank: int | None, ranks: int = 4) -> None:
    """Steps that ended just now, 50 ms apart (the detectors read durations, and a hang is
    judged by how long ago the last step ended); ``slow_rank`` computes 1.5x from step 30."""
    now = time.time()
    for rank in range(ranks):
        events = []
        for n in steps:
            compute = 0.3 * (1 + 0.01 * ((n * 7 + rank * 3) % 5 - 2))
            if rank == slow_rank and n >= 30:
                compute *= 1.5
            events.append(
                {
                    "type": "step",
                    "step": n,
                    "ts": now - 0.05 * (steps[-1] - n),
                    "duration_s": 0.5,
                    "comm_s": 0.5 - compute,
                    "loss": 2.0,
                }
            )
        events.append({"type": "heartbeat", "ts": now, "step": steps[-1] + 1})
        body = batch(events, job=JOB, rank=rank, world_size=ranks)
        reply = httpx.post(f"{base}/api/v1/ingest", json=body, headers=INGEST, timeout=30)
        assert reply.status_code == 200, reply.text


def wait_incident(base: str, status: str, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        reply = httpx.get(f"{base}/api/v1/jobs/{JOB}/incidents", headers=ADMIN, timeout=10)
        found = [i for i in reply.json() if i["kind"] == "straggler"] if reply.is_success else []
        if found and found[0]["status"] == status:
            return found[0]
        time.sleep(0.2)
    raise AssertionError(f"no {status} straggler incident within {timeout} s")


def add_receivers(base: str, rx: Receiver) -> str:
    """An Alertmanager receiver and a generic one; returns the generic one's secret."""
    # Sent at once (no group wait): this story checks one notification per state change;
    # grouping has its own tests (tests/backend/alerts/test_grouping.py).
    am = {"name": "am", "url": rx.url("/am"), "format": "alertmanager", "group_wait_s": 0}
    reply = httpx.post(f"{base}/api/v1/webhooks", json=am, headers=ADMIN)
    assert reply.status_code == 201, reply.text
    generic = {"name": "generic", "url": rx.url("/generic"), "format": "generic"}
    reply = httpx.post(f"{base}/api/v1/webhooks", json=generic, headers=ADMIN)
    assert reply.status_code == 201, reply.text
    return str(reply.json()["secret"])


def check_story(base: str, rx: Receiver, secret: str) -> None:
    """Straggler → firing on both receivers → recovery → resolved on both."""
    rx.fail_next = 1  # the very first notification gets a 500 and must be retried
    post_steps(base, range(0, 120), slow_rank=2)
    incident = wait_incident(base, "open")
    assert incident["ranks"] == [2] and 30 <= incident["first_step"] <= 35

    def statuses(path: str) -> list[str]:
        out = []
        for r in rx.received(path):
            if r["answered"] != 200:
                continue
            body = json.loads(r["body"])  # type: ignore[arg-type]
            out.append(body["status"] if path == "/am" else body["type"])
        return out

    rx.wait(lambda _: "firing" in statuses("/am") and "incident.firing" in statuses("/generic"))
    assert any(r["answered"] == 500 for r in rx.received()), "the forced failure never happened"

    post_steps(base, range(120, 320), slow_rank=None)
    wait_incident(base, "resolved")
    rx.wait(lambda _: "resolved" in statuses("/am") and "incident.resolved" in statuses("/generic"))

    # One notification per state change and receiver (retries of a failed one aside).
    assert statuses("/am") == ["firing", "resolved"]
    assert statuses("/generic") == ["incident.firing", "incident.resolved"]

    firing = json.loads(next(r for r in rx.received("/am") if r["answered"] == 200)["body"])
    assert firing["version"] == "4" and firing["status"] == "firing"
    assert {"groupKey", "receiver", "externalURL", "commonLabels"} <= firing.keys()
    [alert] = firing["alerts"]
    assert alert["labels"]["job"] == JOB and alert["labels"]["kind"] == "straggler"
    assert alert["startsAt"] and alert["fingerprint"]
    assert alert["endsAt"] in ("0001-01-01T00:00:00Z", "")
    resolved = json.loads([r for r in rx.received("/am") if r["answered"] == 200][-1]["body"])
    assert resolved["alerts"][0]["fingerprint"] == alert["fingerprint"]
    assert resolved["alerts"][0]["endsAt"] > resolved["alerts"][0]["startsAt"]

    key = base64.b64decode(secret.removeprefix("whsec_"))
    for r in rx.received("/generic"):
        headers = r["headers"]
        signed = f"{headers['webhook-id']}.{headers['webhook-timestamp']}.".encode() + r["body"]  # type: ignore[index,operator]
        expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
        assert f"v1,{expected}" in headers["webhook-signature"].split(" ")  # type: ignore[index,union-attr]


@pytest.mark.slow
def test_embedded_server_detects_and_notifies(sqlite_url):
    with Receiver() as rx, live_server(sqlite_url, **FAST) as base:
        assert httpx.get(f"{base}/healthz").json()["mode"] == "embedded"
        check_story(base, rx, add_receivers(base, rx))


@pytest.mark.slow
def test_celery_worker_detects_and_notifies(redis_url, shared_db):
    env = vigil_env(shared_db, VIGIL_REDIS_URL=redis_url, **FAST)
    with (
        Receiver() as rx,
        vigil_process(["worker", "--concurrency", "2"], env) as worker,
        vigil_process(["beat"], env) as beat,
        live_server(shared_db, VIGIL_REDIS_URL=redis_url, **FAST) as base,
    ):
        assert httpx.get(f"{base}/healthz").json()["mode"] == "distributed"
        check_story(base, rx, add_receivers(base, rx))
        assert worker.poll() is None and beat.poll() is None
