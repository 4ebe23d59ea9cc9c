"""The relay: the node's ranks POST their batches to it over the loopback, as they would to
the server (``VIGIL_ENDPOINT=http://127.0.0.1:PORT``, same token, same contract); it merges
them into one ``/api/v1/ingest/multi`` request per flush and answers each rank with the
server's answer for its own batch.

Guarantees, the same as without it:

- **Nothing acknowledged is lost.** A rank hears 200 only after the server stored its batch
  (or found it a duplicate); the relay keeps no spool. Until then the batch stays in the
  rank's own buffer, and a relay restart or a server outage only makes the rank retry.
- **Exactly once.** A rank retries with the same ``batch_id`` and body; the relay forwards
  the body's bytes unchanged, so the server deduplicates it as it would a direct retry.
- **Actions reach the right rank.** The server answers each batch with the actions for its
  rank; the relay hands each rank its own answer.
- **Liveness first.** A flush's heartbeat-only batches go in requests of their own, before
  its telemetry: an overloaded server that refuses the telemetry (429) still takes them
  (its heartbeat lane, ``collector.lane``), so it does not see a node's live ranks go
  silent together. A rank whose telemetry got 429 sends its heartbeats alone meanwhile
  (``collector.shipper``), and those go apart too.
- **Bounded memory.** At most ``Limits.max_bytes`` / ``max_batches`` held and
  ``max_connections`` ranks waiting; past that a rank gets 429 (or 503) with
  ``Retry-After`` and keeps its batch.

A rank waits at most ``reply_timeout_s`` (keep it under the ranks' ``VIGIL_TIMEOUT_S``,
5 s by default): a batch not yet sent by then is withdrawn and the rank told 503 (retry),
one in flight is answered 503 too (retried, it is stored once).

    relay = Relay(RelayConfig(endpoint="http://vigil:8000", token="…", port=8765))
    relay.start(); …; relay.stop()

``GET /healthz`` answers 200; ``GET /stats`` gives the counters as JSON.
"""

from __future__ import annotations

import hmac
import http.server
import json
import logging
import math
import sys
import threading
import time
import urllib.parse
import zlib
from dataclasses import dataclass, field
from typing import Any

from collector import lane
from collector.relay.buffer import Answer, Entry, Full, Limits, MergeBuffer, lane_parts
from collector.relay.upstream import TooLarge, Upstream, error_answer

log = logging.getLogger("vigil.relay")

INGEST_PATH = "/api/v1/ingest"


@dataclass(frozen=True)
class RelayConfig:
    endpoint: str  # the server
    token: str | None  # the ingest token: sent upstream, and required of the ranks
    host: str = "127.0.0.1"
    port: int = 8765
    limits: Limits = field(default_factory=Limits)
    max_body_bytes: int = 8 * 1024 * 1024  # one rank's batch, before and after gzip
    max_connections: int = 256  # ranks waiting for an answer at once
    reply_timeout_s: float = 4.0
    upstream_timeout_s: float = 30.0


class Relay:
    def __init__(self, config: RelayConfig) -> None:
        self.config = config
        self.buffer = MergeBuffer(config.limits)
        self.upstream = Upstream(config.endpoint, config.token, config.upstream_timeout_s)
        self.waiting = 0  # ranks in a POST: waiting for their answer, or being answered
        self._counts: dict[str, int] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._httpd = _Server((config.host, config.port), self)
        self._threads: list[threading.Thread] = []

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> None:
        for target, name in ((self._httpd.serve_forever, "serve"), (self._flush_loop, "flush")):
            thread = threading.Thread(target=target, name=f"vigil-relay-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop taking batches, forward what is held once more, answer every rank."""
        deadline = time.monotonic() + timeout
        if self._threads:  # shutdown() waits for serve_forever, which start() runs
            self._httpd.shutdown()
        self._stop.set()
        self.buffer.close()
        for thread in self._threads:
            thread.join(max(0.1, deadline - time.monotonic()))
        last = self.buffer.take_all()
        if last:
            self._forward(last)
        while (self.waiting or self.buffer.held()[0]) and time.monotonic() < deadline:
            time.sleep(0.05)  # the handlers write their answers
        self._httpd.server_close()
        self.upstream.close()

    def count(self, what: str, n: int = 1) -> None:
        with self._lock:
            self._counts[what] = self._counts.get(what, 0) + n

    def enter(self) -> bool:
        """A rank's POST begins; False past ``max_connections`` waiting at once."""
        with self._lock:
            if self.waiting >= self.config.max_connections:
                self._counts["refused_busy"] = self._counts.get("refused_busy", 0) + 1
                return False
            self.waiting += 1
            return True

    def leave(self) -> None:
        with self._lock:
            self.waiting -= 1

    def stats(self) -> dict[str, Any]:
        held, held_bytes = self.buffer.held()
        with self._lock:
            counts = dict(self._counts)
        return {
            **counts,
            "upstream_requests": self.upstream.requests,
            "upstream_failures": self.upstream.failures,
            "held_batches": held,
            "held_bytes": held_bytes,
            "last_error": self.upstream.last_error,
        }

    # -- a rank's batch (handler threads) ----------------------------------------------------

    def relay_batch(self, body: bytes, key: Any, beats: bool = False) -> Answer:
        """Hold the batch for the next flush and wait for the server's answer to it."""
        try:
            entry = self.buffer.submit(body, key, beats)
        except Full as exc:
            self.count("refused_full")
            return error_answer(429, "throttled", f"buffer full ({exc}); retry later", 1.0)
        self.count("received")
        if entry.done.wait(self.config.reply_timeout_s) and entry.answer is not None:
            return entry.answer
        self.count("timed_out")
        if self.buffer.withdraw(entry):
            why = "the server has not taken the batch in time"
        else:  # in flight: it may be stored; a retry is then a duplicate, stored once
            why = "no answer from the server in time"
        return error_answer(503, "unavailable", f"{why}; retry it", 1.0)

    # -- the flusher thread ------------------------------------------------------------------

    def _flush_loop(self) -> None:
        while not self._stop.is_set():
            try:
                batch = self.buffer.take(self._stop)
                if batch:
                    self._forward(batch)
            except Exception:  # a bug here must not leave the ranks waiting forever
                log.warning("relay: flush error", exc_info=True)
                time.sleep(0.1)

    def _forward(self, batch: list[Entry]) -> None:
        """Send a flush, heartbeat-only batches first (``lane_parts``); each part's ranks
        are answered as soon as it is."""
        parts = lane_parts(batch)
        for n, part in enumerate(parts):
            try:
                answers = self.upstream.send([entry.body for entry in part])
            except TooLarge as exc:
                self.buffer.requeue([entry for left in parts[n:] for entry in left])
                log.warning("relay: the server found a flush too big (%s); sending less", exc)
                return
            except Exception:
                log.warning("relay: could not forward a flush", exc_info=True)
                answers = [error_answer(503, "unavailable", "internal error", 1.0)] * len(part)
            self.buffer.resolve(part, answers)
            self.count("forwarded", len(part))
            if part[0].beats:
                self.count("forwarded_heartbeats", len(part))


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024  # a node's ranks may all connect at once

    def __init__(self, address: tuple[str, int], relay: Relay) -> None:
        self.relay = relay
        super().__init__(address, _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A rank gone before its answer (it timed out, or exited), or idle past
        ``timeout``, is no error: it retries, or is gone. Anything else is logged, not
        printed to stderr."""
        relay, exc = self.relay, sys.exc_info()[1]
        if isinstance(exc, ConnectionError | TimeoutError):
            relay.count("rank_gone")
            log.debug("relay: %s left before its answer (%s)", client_address, exc)
        else:
            log.warning("relay: error serving %s", client_address, exc_info=True)


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 60  # seconds a connection may sit idle or send its body (then it is closed)
    server: _Server

    def do_POST(self) -> None:
        relay = self.server.relay
        if not relay.enter():
            self.close_connection = True
            busy = f"{relay.config.max_connections} ranks already waiting"
            self._send(error_answer(503, "unavailable", busy, 1.0))
            return
        try:
            self._send(self._ingest(relay))
        finally:
            relay.leave()

    def do_GET(self) -> None:
        path = urllib.parse.urlsplit(self.path).path
        if path == "/healthz":
            self._send(Answer(200, b'{"status": "ok"}'))
        elif path == "/stats":
            self._send(Answer(200, json.dumps(self.server.relay.stats()).encode()))
        else:
            self._send(error_answer(404, "not_found", f"no {path}", None))

    def _ingest(self, relay: Relay) -> Answer:
        config = relay.config
        if urllib.parse.urlsplit(self.path).path.rstrip("/") != INGEST_PATH:
            return self._refuse(404, "not_found", f"POST batches to {INGEST_PATH}")
        given = self.headers.get("Authorization", "")
        if config.token and not hmac.compare_digest(
            given.encode(), f"Bearer {config.token}".encode()
        ):
            return self._refuse(401, "unauthorized", "missing or wrong token (the relay's)")
        ctype = self.headers.get("Content-Type", "application/json").split(";")[0].strip()
        if ctype not in ("application/json", ""):
            return self._refuse(415, "unsupported_media_type", f"content-type {ctype!r}")
        length = self.headers.get("Content-Length", "")
        if not length.isdigit():
            return self._refuse(411, "length_required", "send a Content-Length")
        if int(length) > config.max_body_bytes:
            return self._refuse(413, "too_large", f"body over {config.max_body_bytes} bytes")
        body = self.rfile.read(int(length))
        encoding = self.headers.get("Content-Encoding", "identity").strip().lower()
        if encoding == "gzip":
            inflated = _gunzip(body, config.max_body_bytes)
            if isinstance(inflated, str):
                return error_answer(
                    413 if "limit" in inflated else 400, "bad_request", inflated, None
                )
            body = inflated
        elif encoding not in ("identity", ""):
            return error_answer(415, "unsupported_media_type", f"encoding {encoding!r}", None)
        if not body.strip():
            return error_answer(400, "bad_request", "body is empty", None)
        line = one_line(body)
        return relay.relay_batch(line, *sort_out(line))

    def _refuse(self, status: int, code: str, detail: str) -> Answer:
        self.close_connection = True  # the body was not read
        return error_answer(status, code, detail, None)

    def _send(self, answer: Answer) -> None:
        self.send_response(answer.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer.body)))
        if answer.retry_after is not None or answer.status in (429, 503):
            wait = 1.0 if answer.retry_after is None else answer.retry_after
            self.send_header("Retry-After", str(max(0, math.ceil(wait))))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(answer.body)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("relay: %s " + format, self.address_string(), *args)


def one_line(body: bytes) -> bytes:
    """The body as one NDJSON line. Raw CR/LF can only be whitespace in JSON (inside a
    string they are escaped), so blanking them changes nothing the server reads, and does
    it the same way on every retry (the content hash stays the same)."""
    if b"\n" in body or b"\r" in body:
        return body.replace(b"\r", b" ").replace(b"\n", b" ")
    return body


def sort_out(body: bytes) -> tuple[tuple[str, str, str] | None, bool]:
    """Who sent the batch — (job, run, rank) — so a flush need not wait for a rank whose
    batch is already there (None for a body that is not a JSON object); and whether it is
    heartbeat-only (``collector.lane``), to be sent apart from the telemetry."""
    try:
        batch = json.loads(body)
    except ValueError:
        return None, False
    if not isinstance(batch, dict):
        return None, False
    key = (str(batch.get("job")), str(batch.get("run")), str(batch.get("rank")))
    return key, len(body) <= lane.MAX_BYTES and lane.heartbeats(batch)


def _gunzip(body: bytes, limit: int) -> bytes | str:
    inflater = zlib.decompressobj(wbits=31)
    try:
        out = inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        return f"body is not valid gzip: {exc}"
    if len(out) > limit or inflater.unconsumed_tail:
        return f"decompressed body exceeds the {limit}-byte limit"
    if not inflater.eof or inflater.unused_data:
        return "body is not valid gzip: one complete gzip member, nothing after it"
    return out
