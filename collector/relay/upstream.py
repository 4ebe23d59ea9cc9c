"""The relay's connection to the server: a flush's batches as one ``POST
/api/v1/ingest/multi`` (NDJSON, gzip), and each batch's answer from the reply.

The server answers each batch as ``/api/v1/ingest`` would have answered it alone (its
actions for that rank included), and the rank gets exactly that. What goes wrong with the
request as a whole is no batch's fault, so no rank is told its batch is bad:

- the server unreachable or too slow, a 5xx, a reply that does not parse, or a 4xx that
  means the relay is wrong (400, 415, 422): every batch gets 503 with ``Retry-After``; the
  rank keeps it and retries (a batch the server stored before the trouble is then a
  duplicate, stored once);
- 429 or 503: the same status and ``Retry-After`` for every batch;
- 401, 403, 404: passed on, as the ranks' own would be (the relay's token or endpoint is
  wrong; the ranks back off and keep their data);
- 413: the flush was too big; ``TooLarge`` tells the relay to send it in smaller parts
  (one batch alone gets the 413, as it would have without the relay).

One connection, kept alive; a kept-alive connection the server closed is opened again and
the request sent once more (safe: batches are idempotent on ``batch_id``).
"""

from __future__ import annotations

import gzip
import http.client
import json
import logging
import time
import urllib.parse
from typing import Any

from collector.relay.buffer import Answer

log = logging.getLogger("vigil.relay")

GZIP_ABOVE = 1024
PASSED_ON = (401, 403, 404)
RELAY_RETRY_AFTER_S = 1.0
LOG_EVERY_S = 60.0


class TooLarge(Exception):
    """The server refused the flush's size (413); send fewer batches at a time."""


def error_answer(status: int, code: str, detail: str, retry_after: float | None) -> Answer:
    """An answer in the server's one error shape, for what the relay itself decides."""
    body = {"error": code, "status": status, "detail": f"relay: {detail}"}
    return Answer(status, json.dumps(body).encode(), retry_after)


class Upstream:
    def __init__(self, endpoint: str, token: str | None, timeout_s: float) -> None:
        parts = urllib.parse.urlsplit(endpoint)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"the server's endpoint must be an http(s) URL, not {endpoint!r}")
        self.endpoint = endpoint.rstrip("/")
        self._https = parts.scheme == "https"
        self._host, self._port = parts.hostname, parts.port
        self.path = parts.path.rstrip("/") + "/api/v1/ingest/multi"
        self.token = token
        self.timeout_s = timeout_s
        self._conn: http.client.HTTPConnection | None = None
        self.requests = 0  # sent to the server
        self.failures = 0  # that got no per-batch answers
        self.last_error = ""
        self._logged_at = 0.0

    def send(self, bodies: list[bytes]) -> list[Answer]:
        """One answer per body, in order. Raises ``TooLarge`` only (413, several bodies)."""
        payload = b"\n".join(bodies)
        headers = {"Content-Type": "application/x-ndjson", "User-Agent": "vigil-relay"}
        if len(payload) > GZIP_ABOVE:
            payload = gzip.compress(payload, compresslevel=1)
            headers["Content-Encoding"] = "gzip"
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        self.requests += 1
        try:
            status, retry_after, data = self._post(payload, headers)
        except (OSError, http.client.HTTPException) as exc:
            return self._failed(len(bodies), f"the server at {self.endpoint} did not answer: {exc}")
        if status == 200:
            answers = _answers(data, len(bodies))
            if answers is None:
                return self._failed(len(bodies), "the server's reply could not be read")
            self._recovered()
            return answers
        if status == 413 and len(bodies) > 1:
            raise TooLarge(f"{len(bodies)} batches, {len(payload)} bytes")
        if status in (429, 503) or status in PASSED_ON or status == 413:
            self._trouble(f"the server answered {status}: {data[:200]!r}")
            return [Answer(status, data, retry_after) for _ in bodies]
        return self._failed(len(bodies), f"the server answered {status}: {data[:200]!r}")

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _post(self, payload: bytes, headers: dict[str, str]) -> tuple[int, float | None, bytes]:
        for again in (False, True):
            fresh = self._conn is None
            if self._conn is None:
                cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
                self._conn = cls(self._host, self._port, timeout=self.timeout_s)
            conn = self._conn
            try:
                conn.request("POST", self.path, body=payload, headers=headers)
                reply = conn.getresponse()
                data = reply.read()
            except (ConnectionResetError, BrokenPipeError) as exc:
                self.close()
                if fresh or again:
                    raise
                log.debug("relay: kept-alive connection closed by the server (%s)", exc)
                continue
            except BaseException:
                self.close()
                raise
            if reply.will_close:
                self.close()
            return reply.status, _retry_after(reply.getheader("Retry-After")), data
        raise AssertionError("unreachable")  # pragma: no cover

    def _failed(self, n: int, reason: str) -> list[Answer]:
        self.failures += 1
        self._trouble(reason)
        answer = error_answer(503, "unavailable", reason, RELAY_RETRY_AFTER_S)
        return [answer] * n

    def _trouble(self, reason: str) -> None:
        now = time.monotonic()
        if reason != self.last_error or now - self._logged_at >= LOG_EVERY_S:
            log.warning("relay: %s; the ranks keep their batches and retry", reason)
            self._logged_at = now
        self.last_error = reason

    def _recovered(self) -> None:
        if self.last_error:
            log.warning("relay: the server takes batches again")
            self.last_error = ""


def _answers(data: bytes, n: int) -> list[Answer] | None:
    try:
        results = json.loads(data)["results"]
    except (ValueError, KeyError, TypeError):
        return None
    if not isinstance(results, list) or len(results) != n:
        return None
    return [_answer(r) for r in results]


def _answer(result: Any) -> Answer:
    """A batch's answer as ``/api/v1/ingest`` gives it: the reply without ``status`` for a
    200, the error body with ``Retry-After`` taken out of it otherwise."""
    status = result.get("status") if isinstance(result, dict) else None
    if not isinstance(status, int) or not 200 <= status <= 599:
        return error_answer(503, "unavailable", "the server's answer was unreadable", 1.0)
    if status == 200:
        body = {k: v for k, v in result.items() if k != "status"}
        return Answer(200, json.dumps(body).encode())
    retry = _retry_after(result.pop("retry_after", None))
    return Answer(status, json.dumps(result).encode(), retry)


def _retry_after(value: Any) -> float | None:
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except (TypeError, ValueError):
        return RELAY_RETRY_AFTER_S
