"""A stand-in for the server's ``/api/v1/ingest/multi`` (the relay's upstream) that plays an
overloaded server on cue: while ``overloaded`` is set, a request holding any telemetry line
gets 429 as a whole (one admission slot per request, as the real server), while a request
of heartbeat-only lines gets 200 for each (the heartbeat lane, ``backend.ingest.admission``).
Otherwise every line gets 200. A real server cannot be made to refuse on demand; its own
lane is tested in tests/backend/ingest/.

    with OverloadedUpstream() as upstream:
        upstream.overloaded.set()
        ...                               # a relay, or the load generator, sends to it
        upstream.delivered()              # batches answered 200, each batch_id once
"""

from __future__ import annotations

import gzip
import json
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.servers import free_port


def heartbeat_only(batch: dict[str, Any]) -> bool:
    return all(e.get("type") == "heartbeat" for e in batch["events"])


@dataclass
class Request:
    at: float  # monotonic, when it arrived
    batches: list[dict[str, Any]]
    status: int  # of the whole request

    @property
    def heartbeat_only(self) -> bool:
        return all(heartbeat_only(b) for b in self.batches)


class OverloadedUpstream:
    def __init__(self, retry_after: str = "0") -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.retry_after = retry_after
        self.overloaded = threading.Event()
        self.requests: list[Request] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    def __enter__(self) -> OverloadedUpstream:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                status, reply = outer._answer([json.loads(x) for x in body.split(b"\n") if x])
                self._send(status, reply)

            def do_GET(self) -> None:  # the load generator's incident polls: no such job
                self._send(404, {"error": "not_found", "status": 404, "detail": "fake"})

            def _send(self, status: int, reply: dict[str, Any]) -> None:
                data = json.dumps(reply).encode()
                self.send_response(status)
                if status == 429:
                    self.send_header("Retry-After", outer.retry_after)
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
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def _answer(self, batches: list[dict[str, Any]]) -> tuple[int, dict[str, Any]]:
        with self._lock:
            stored = {b["batch_id"] for r in self.requests if r.status == 200 for b in r.batches}
            request = Request(time.monotonic(), batches, 200)
            if self.overloaded.is_set() and not request.heartbeat_only:
                request.status = 429
            self.requests.append(request)
        if request.status == 429:
            return 429, {"error": "throttled", "status": 429, "detail": "server saturated"}
        results = [
            {"status": 200, "accepted": len(b["events"]), "duplicate": b["batch_id"] in stored}
            for b in batches
        ]
        return 200, {"results": [{**r, "actions": []} for r in results]}

    def snapshot(self) -> list[Request]:
        with self._lock:
            return list(self.requests)

    def delivered(self) -> list[dict[str, Any]]:
        """Batches answered 200, each ``batch_id`` once (as the server stores them)."""
        seen: set[str] = set()
        out = []
        for request in self.snapshot():
            for b in request.batches if request.status == 200 else []:
                if b["batch_id"] not in seen:
                    seen.add(b["batch_id"])
                    out.append(b)
        return out
