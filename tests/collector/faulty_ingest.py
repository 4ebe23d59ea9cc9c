"""A stand-in ingest endpoint that injects faults on cue: it plays a faulty network or
server (one batch answered 500 forever, a 422 naming an event, a bad token, an outage),
which a real ``vigil server`` cannot be made to do on demand. Tests of the real server's
answers live in tests/reliability/ and tests/backend/ingest/.

    with FaultyIngest() as ingest:
        ingest.fault = lambda batch: 500 if has_poison(batch) else None
        vigil.init(job="j", endpoint=ingest.url, integrations=False)
        ...
        ingest.delivered_events()          # events of batches answered 200, once per batch_id
"""

from __future__ import annotations

import gzip
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.servers import free_port

# A fault: None answers 200; an int answers that status with a generic error body; a
# (status, body, headers) tuple answers exactly that.
Fault = int | tuple[int, dict[str, Any], dict[str, str]] | None


@dataclass
class Call:
    at: float  # monotonic
    batch: dict[str, Any]
    status: int

    @property
    def heartbeat_only(self) -> bool:
        return all(e.get("type") == "heartbeat" for e in self.batch["events"])


class FaultyIngest:
    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.fault: Callable[[dict[str, Any]], Fault] = lambda batch: None
        # Seconds to hold the answer back after taking the batch (a server slower than the
        # collector's timeout: the batch is stored, the answer never arrives).
        self.delay: Callable[[dict[str, Any]], float] = lambda batch: 0.0
        self.actions: list[dict[str, Any]] = []  # sent in every 200 reply
        self.calls: list[Call] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    # -- control -------------------------------------------------------------------------

    def start(self) -> None:
        """Listen (again) on the same port."""
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                batch = json.loads(body)
                fault = outer.fault(batch)
                if fault is None:
                    status, reply, headers = (
                        200,
                        {"accepted": len(batch["events"]), "actions": outer.actions},
                        {},
                    )
                elif isinstance(fault, int):
                    reply = {"error": "fault", "status": fault, "detail": "injected fault"}
                    status, headers = fault, {}
                else:
                    status, reply, headers = fault
                with outer._lock:
                    outer.calls.append(Call(time.monotonic(), batch, status))
                time.sleep(outer.delay(batch))
                data = json.dumps(reply).encode()
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        self._server = server

    def stop(self) -> None:
        """Stop listening: connections are refused until ``start``."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()

    def __enter__(self) -> FaultyIngest:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- what arrived ----------------------------------------------------------------------

    def snapshot(self) -> list[Call]:
        with self._lock:
            return list(self.calls)

    def delivered_events(self, type_: str | None = None) -> list[dict[str, Any]]:
        """Events of batches answered 200, each ``batch_id`` counted once (as the server)."""
        seen: set[str] = set()
        out = []
        for call in self.snapshot():
            if call.status != 200 or call.batch["batch_id"] in seen:
                continue
            seen.add(call.batch["batch_id"])
            out.extend(e for e in call.batch["events"] if type_ is None or e["type"] == type_)
        return out

    def delivered_steps(self) -> list[int]:
        return [e["step"] for e in self.delivered_events("step")]


def has_event(batch: dict[str, Any], name: str) -> bool:
    return any(e.get("type") == "event" and e.get("name") == name for e in batch["events"])


def unprocessable(batch: dict[str, Any], name: str) -> Fault:
    """Answer 422 naming the offending events' fields, as the real server's body does."""
    bad = [
        i
        for i, e in enumerate(batch["events"])
        if e.get("type") == "event" and e.get("name") == name
    ]
    if not bad:
        return None
    detail = [
        {
            "field": f"events[{i}].name",
            "msg": "must not contain NUL characters",
            "type": "value_error",
            "loc": ["body", "events", i, "event", "name"],
        }
        for i in bad
    ]
    return 422, {"error": "invalid", "status": 422, "detail": detail}, {}


def wait_until(ready: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.05)
