"""HTTP transport: one POST per batch to ``/api/v1/ingest``, standard library only.

``send`` never raises. It returns an ``Outcome`` telling the worker whether the batch was
delivered, must be retried (and after how long), or was refused for good, with the
server's status and error ``detail`` (which names the offending fields).
"""

from __future__ import annotations

import gzip
import json
import logging
import random
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("vigil.collector")

GZIP_ABOVE = 1024  # bytes; smaller bodies are not worth compressing


AUTH_STATUSES = (401, 403, 404)  # the token or the endpoint is wrong, not the batch


@dataclass
class Outcome:
    delivered: bool
    retry_after: float | None = None  # seconds, when the batch should be tried again
    reason: str = ""  # why it was not delivered
    actions: list[dict[str, Any]] = field(default_factory=list)
    status: int | None = None  # the HTTP status of a refusal
    detail: Any = None  # the error body's ``detail``
    code: str = ""  # the error body's ``error`` code
    # The request went out but no answer came back (a timeout, a reset mid-reply): the
    # server may have stored the batch. Not a sign the batch is bad (see the shipper).
    unanswered: bool = False

    @property
    def already_stored(self) -> bool:
        """The server holds another version of this batch id: an earlier send of it (with a
        heartbeat riding along, or before its oldest events were dropped) landed."""
        return self.status == 409 and self.code == "batch_id_reused"

    @property
    def kind(self) -> str:
        """``delivered``; ``retry`` (unreachable, 5xx: with backoff); ``throttled``
        (``Retry-After``); ``auth`` (401/403/404: fix the configuration); ``refused`` (any
        other 4xx, or ``unencodable``: this batch will never be taken as it is)."""
        if self.delivered:
            return "delivered"
        if self.status in AUTH_STATUSES:
            return "auth"
        if self.retry_after is None:
            return "refused"
        return "throttled" if self.retry_after >= 0 else "retry"


class Backoff:
    """Exponential backoff with full jitter: 0.5 s, 1 s, 2 s, … capped, randomised."""

    def __init__(self, base: float = 0.5, cap: float = 4.0) -> None:
        self.base, self.cap, self.failures = base, cap, 0

    def next_delay(self) -> float:
        self.failures += 1
        return random.uniform(self.base / 2, min(self.cap, self.base * 2 ** (self.failures - 1)))

    def reset(self) -> None:
        self.failures = 0


class HttpTransport:
    def __init__(self, endpoint: str, token: str | None, timeout_s: float) -> None:
        self.url = endpoint.rstrip("/") + "/api/v1/ingest"
        self.token = token
        self.timeout_s = timeout_s

    def send(self, batch: dict[str, Any]) -> Outcome:
        try:
            body = json.dumps(batch, separators=(",", ":")).encode()
        except (TypeError, ValueError) as exc:
            log.warning("vigil: dropping a batch that cannot be encoded: %s", exc)
            return Outcome(False, reason="unencodable")
        headers = {"Content-Type": "application/json", "User-Agent": "vigil-collector"}
        if len(body) > GZIP_ABOVE:
            body = gzip.compress(body, compresslevel=1)
            headers["Content-Encoding"] = "gzip"
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        request = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as reply:
                payload = json.loads(reply.read() or b"{}")
            actions = payload.get("actions") or []
            return Outcome(True, actions=actions if isinstance(actions, list) else [])
        except urllib.error.HTTPError as exc:
            return self._http_error(exc)
        except urllib.error.URLError as exc:  # not sent: refused, unresolvable, no route
            return Outcome(False, retry_after=-1, reason=f"unreachable: {exc}")
        except (OSError, ValueError) as exc:  # sent; the answer timed out, broke, or is junk
            return Outcome(False, retry_after=-1, reason=f"no answer: {exc}", unanswered=True)

    def _http_error(self, exc: urllib.error.HTTPError) -> Outcome:
        status = exc.code
        detail, code = _detail(exc)
        text = detail if isinstance(detail, str) else json.dumps(detail)[:400]
        reason = f"http {status}: {text}" if text else f"http {status}"
        if status == 429 or status == 503:
            return Outcome(False, retry_after=_retry_after(exc), reason=reason, status=status)
        if status >= 500 or status in (408, 425):
            return Outcome(False, retry_after=-1, reason=reason, status=status)
        # 4xx: the server will never take this batch as it is.
        return Outcome(False, reason=reason, status=status, detail=detail, code=code)


def _detail(exc: urllib.error.HTTPError) -> tuple[Any, str]:
    """The error body's ``detail`` (Vigil's one error shape), else its text; and its
    ``error`` code."""
    try:
        raw = exc.read(64 * 1024)
    except OSError:
        return "", ""
    try:
        body = json.loads(raw)
    except ValueError:
        return raw[:400].decode(errors="replace"), ""
    if not isinstance(body, dict):
        return body, ""
    code = body.get("error")
    return body.get("detail", body), code if isinstance(code, str) else ""


def _retry_after(exc: urllib.error.HTTPError) -> float:
    try:
        return max(0.0, float(exc.headers.get("Retry-After", "1")))
    except (TypeError, ValueError):
        return 1.0
