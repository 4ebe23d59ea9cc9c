"""Requests are authenticated before their body is read, every body is limited, and live
streams are capped (``backend.limits``, ``backend.ui.stream``).

The body tests drive the ASGI app directly, as a server does, with a ``receive`` that
counts what the app asked for: that is how "the body was never read" can be asserted.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from backend.api import create_app
from tests.conftest import ADMIN, INGEST
from tests.factories import batch, step
from tests.servers import live_server

LIMIT = 4096  # max_request_bytes in these tests
CHUNK = 1024


@pytest.fixture
def small(settings, engine, session_factory):  # type: ignore[no-untyped-def]
    limited = settings.model_copy(update={"max_request_bytes": LIMIT, "max_body_bytes": 64_000})
    return create_app(limited, engine=engine, session_factory=session_factory)


class Upload:
    """What a client sends: ``chunks`` body messages of ``CHUNK`` bytes."""

    def __init__(self, chunks: int) -> None:
        self.chunks = chunks
        self.sent = 0  # body bytes the app pulled

    async def receive(self) -> dict[str, Any]:
        if self.sent >= self.chunks * CHUNK:
            await asyncio.sleep(3600)  # the client waits for the reply
        self.sent += CHUNK
        more = self.sent < self.chunks * CHUNK
        return {"type": "http.request", "body": b" " * CHUNK, "more_body": more}


def call(  # type: ignore[no-untyped-def]
    app, method: str, path: str, headers: dict[str, str], upload: Upload
) -> tuple[int, dict[str, str], bytes]:
    """One request through the ASGI app; the status, headers and body of its reply."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
    }
    out: dict[str, Any] = {"body": b""}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            out["status"] = message["status"]
            out["headers"] = {k.decode(): v.decode() for k, v in message["headers"]}
        elif message["type"] == "http.response.body":
            out["body"] += message.get("body", b"")

    async def run() -> None:
        await asyncio.wait_for(app(scope, upload.receive, send), timeout=10)

    asyncio.run(run())
    return out["status"], out["headers"], out["body"]


JSON = {"content-type": "application/json"}
HUGE = {**JSON, "content-length": str(100 * 1024 * 1024)}
BODY_ROUTES = [
    ("POST", "/api/v1/webhooks"),
    ("POST", "/api/v1/tokens"),
    ("POST", "/api/v1/slos"),
    ("PATCH", "/api/v1/slos/1"),
    ("PUT", "/api/v1/policies/hang"),
    ("POST", "/api/v1/jobs/j/actions"),
    ("POST", "/api/v1/ingest"),
]


@pytest.mark.parametrize(("method", "path"), BODY_ROUTES)
@pytest.mark.parametrize("auth", [None, "Bearer not-a-token", "Bearer vgl_unknown", "Basic x"])
def test_no_valid_token_is_401_before_a_byte_of_the_body_is_read(app, method, path, auth):
    headers = {**HUGE, **({"authorization": auth} if auth else {})}
    upload = Upload(chunks=64)
    status, reply_headers, body = call(app, method, path, headers, upload)
    assert status == 401, body
    assert reply_headers["www-authenticate"] == "Bearer"
    assert upload.sent == 0  # the 100 MB were never pulled off the socket


def test_a_declared_length_over_the_limit_is_413_unread(small):
    upload = Upload(chunks=4 * LIMIT // CHUNK)
    headers = {**JSON, **ADMIN, "content-length": str(LIMIT + 1)}
    status, _, body = call(small, "POST", "/api/v1/webhooks", headers, upload)
    assert status == 413, body
    assert upload.sent == 0
    assert f"{LIMIT}-byte limit" in body.decode()


@pytest.mark.parametrize(("method", "path"), BODY_ROUTES[:-1])
def test_a_chunked_body_is_cut_off_at_the_limit(small, method, path):
    upload = Upload(chunks=4 * LIMIT // CHUNK)  # no Content-Length
    status, reply_headers, body = call(small, method, path, {**JSON, **ADMIN}, upload)
    assert status == 413, body
    assert reply_headers["content-type"] == "application/json"
    assert LIMIT < upload.sent <= LIMIT + CHUNK  # stopped at the first chunk past it
    assert f"request body exceeds the {LIMIT}-byte limit" in body.decode()


def test_ingest_has_its_own_larger_limit(small):
    body = batch([step(n) for n in range(40)])
    with TestClient(small) as client:
        big = client.post("/api/v1/ingest", json=body, headers=INGEST)
        assert big.status_code == 200, big.text  # > max_request_bytes, < max_body_bytes
        upload = Upload(chunks=2 * 64_000 // CHUNK)
        status, _, reply = call(small, "POST", "/api/v1/ingest", {**JSON, **INGEST}, upload)
    assert status == 413 and 64_000 < upload.sent <= 64_000 + CHUNK, reply


def test_a_body_within_the_limit_still_works(small):
    with TestClient(small) as client:
        reply = client.post(
            "/api/v1/webhooks", json={"name": "a", "url": "http://127.0.0.1:9/"}, headers=ADMIN
        )
    assert reply.status_code == 201, reply.text


def test_dashboard_forms_are_limited_too(small):
    upload = Upload(chunks=4 * LIMIT // CHUNK)
    status, _, _ = call(small, "POST", "/ui/webhooks", {"content-type": "text/plain"}, upload)
    assert status == 413
    assert upload.sent <= LIMIT + CHUNK


# --- live streams ---------------------------------------------------------------------


def test_stream_slots_count_per_key_and_in_total():
    from backend.ui.stream import StreamSlots

    slots = StreamSlots(total=3, per_key=2)
    assert slots.acquire("a") is None and slots.acquire("a") is None
    assert slots.acquire("a") == 429  # a's third
    assert slots.acquire("b") is None
    assert slots.acquire("c") == 503  # all three taken
    slots.release("a")
    assert slots.acquire("c") is None
    assert slots.open() == 3


@pytest.fixture
def stream_server(sqlite_url: str) -> Iterator[str]:
    env = {"VIGIL_MAX_STREAMS": "3", "VIGIL_MAX_STREAMS_PER_TOKEN": "2"}
    with live_server(sqlite_url, **env) as base:
        reply = httpx.post(f"{base}/api/v1/ingest", json=batch([step(1)]), headers=INGEST)
        assert reply.status_code == 200, reply.text
        yield base


@pytest.mark.timeout(120)
def test_live_streams_are_capped_per_token_and_in_total(stream_server):
    base = stream_server
    url = f"{base}/ui/jobs/llama-8b-pretrain/stream"
    made = httpx.post(
        f"{base}/api/v1/tokens", json={"name": "viewer", "scopes": ["read"]}, headers=ADMIN
    )
    viewer = {"Authorization": f"Bearer {made.json()['token']}"}
    client = httpx.Client(timeout=10)
    opened = []

    def open_stream(headers: dict[str, str]) -> httpx.Response:
        reply = client.send(client.build_request("GET", url, headers=headers), stream=True)
        opened.append(reply)
        return reply

    try:
        first, second = open_stream(ADMIN), open_stream(ADMIN)
        assert first.status_code == second.status_code == 200
        third = open_stream(ADMIN)  # the token's third
        assert third.status_code == 429
        assert third.headers["retry-after"].isdigit()
        assert "live streams" in third.read().decode()
        assert open_stream(viewer).status_code == 200  # another token: 3 in total now
        full = open_stream(viewer)
        assert full.status_code == 503 and full.headers["retry-after"].isdigit()

        first.close()  # the browser goes away: its slot is freed
        deadline = time.monotonic() + 20
        while True:
            again = open_stream(ADMIN)
            if again.status_code == 200:
                break
            again.close()
            assert time.monotonic() < deadline, "a closed stream did not free its slot"
            time.sleep(0.2)
    finally:
        for reply in opened:
            reply.close()
        client.close()


# --- where webhooks may go ------------------------------------------------------------


def test_webhooks_go_only_to_the_allowed_hosts():
    from backend.alerts.sender import Claimed, post_if_allowed
    from backend.settings import Settings

    allowed = Settings(webhook_hosts=" 127.0.0.1, Alertmanager ").allowed_webhook_hosts()
    assert allowed == {"127.0.0.1", "alertmanager"}
    item = Claimed(1, 1, "test", "r", "generic", "http://example.com/hook", None, "w", {}, b"{}")
    with httpx.Client(timeout=1) as client:
        outcome = post_if_allowed(client, item, allowed)
    assert not outcome.delivered and not outcome.retry
    assert outcome.error == "host 'example.com' is not in VIGIL_WEBHOOK_HOSTS; not sent"
