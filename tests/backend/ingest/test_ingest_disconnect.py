"""A sender that gives up mid-body (its own timeout, at 512 ranks on a busy server) is no
server error: the request ends with a 400 and nothing stored, not an unhandled exception
logged as a 500 thousands of times."""

from __future__ import annotations

import asyncio
from typing import Any

from sqlalchemy import func, select

from backend.telemetry.models import StepRecord
from tests.conftest import INGEST


def test_a_body_cut_off_by_a_disconnect_is_a_400_and_stores_nothing(app, session):  # type: ignore[no-untyped-def]
    sent: list[dict[str, Any]] = []
    incoming = [
        {"type": "http.request", "body": b'{"batch_id": "x", "job": "j", "ev', "more_body": True},
        {"type": "http.disconnect"},
    ]

    async def receive() -> dict[str, Any]:
        return incoming.pop(0) if incoming else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    headers = [(k.lower().encode(), v.encode()) for k, v in INGEST.items()]
    headers += [(b"content-type", b"application/json"), (b"content-length", b"4000")]
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/api/v1/ingest",
        "raw_path": b"/api/v1/ingest",
        "query_string": b"",
        "headers": headers,
        "client": ("127.0.0.1", 5000),
        "server": ("127.0.0.1", 8000),
    }
    asyncio.run(app(scope, receive, send))  # raises if the disconnect escapes as an error
    start = next(m for m in sent if m["type"] == "http.response.start")
    assert start["status"] == 400
    assert session.scalar(select(func.count()).select_from(StepRecord)) == 0
