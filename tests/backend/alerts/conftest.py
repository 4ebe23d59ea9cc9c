"""A fake webhook receiver (a real local HTTP server) and incident builders."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from backend.alerts import service
from backend.alerts.models import WebhookReceiver
from backend.incidents.models import Incident
from backend.jobs.models import Job

T0 = datetime(2024, 11, 22, 0, 10, tzinfo=UTC)


@dataclass
class Request:
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class FakeReceiver:
    """Records every request; answers with ``script`` codes first (then 200), or hangs
    until the test ends while ``hang`` is set."""

    url: str = ""
    requests: list[Request] = field(default_factory=list)
    script: list[int] = field(default_factory=list)
    response_headers: dict[str, str] = field(default_factory=dict)
    hang: bool = False
    release: threading.Event = field(default_factory=threading.Event)

    def answer(self, *codes: int, **headers: str) -> None:
        self.script.extend(codes)
        self.response_headers.update(headers)


@pytest.fixture
def receiver_server() -> Iterator[FakeReceiver]:
    fake = FakeReceiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", 0)))
            fake.requests.append(
                Request(self.path, {k.lower(): v for k, v in self.headers.items()}, body)
            )
            if fake.hang:
                fake.release.wait(30)
                return
            code = fake.script.pop(0) if fake.script else 200
            reply = b'{"ok": true}' if code < 300 else b"receiver says no"
            self.send_response(code)
            for key, value in fake.response_headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    fake.url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    yield fake
    fake.release.set()
    server.shutdown()
    server.server_close()


def make_job(session: Session, name: str = "llama-8b") -> Job:
    job = session.scalar(select(Job).where(Job.name == name))
    if job is None:
        job = Job(name=name, kind="training", world_size=8, attempt=0, created_at=T0)
        session.add(job)
        session.flush()
    return job


def make_incident(
    session: Session,
    *,
    job: str = "llama-8b",
    kind: str = "straggler",
    severity: str = "critical",
    status: str = "open",
    fingerprint: str | None = None,
    at: datetime = T0,
) -> Incident:
    job_row = make_job(session, job)
    row = Incident(
        job_id=job_row.id,
        kind=kind,
        severity=severity,
        status=status,
        fingerprint=fingerprint or f"{job_row.id}:{kind}:6",
        ranks=[6],
        first_step=1810,
        score=7.5,
        summary="rank 6 computes 2.1x slower than the median rank",
        evidence={"ratio": 2.1},
        detected_at=at,
        updated_at=at,
        resolved_at=at + timedelta(minutes=5) if status == "resolved" else None,
    )
    session.add(row)
    session.flush()
    return row


def resolve(session: Session, incident: Incident, at: datetime) -> Incident:
    incident.status, incident.resolved_at, incident.updated_at = "resolved", at, at
    session.flush()
    return incident


def make_receiver(session: Session, name: str = "oncall", **fields: Any) -> WebhookReceiver:
    """A receiver; sent at once unless the test gives a ``group_wait_s`` (grouping tests)."""
    fields.setdefault("url", "http://127.0.0.1:9/hook")
    fields.setdefault("group_wait_s", 0)
    return service.create_receiver(session=session, name=name, **fields)


@pytest.fixture(autouse=True)
def _sealing_key() -> Iterator[None]:
    """Tests that call the services without an app still seal with a key (a fixed test key,
    not a key file next to ./vigil.db, which is what a process without settings would use)."""
    from backend.alerts import sealing

    before = sealing._keyring
    if before is None:
        sealing._keyring = sealing.Keyring(["vigil-tests-sealing-key"], "tests")
    yield
    sealing._keyring = before
