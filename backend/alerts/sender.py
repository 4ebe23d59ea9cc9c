"""Post due webhook deliveries, outside any database transaction.

    sent = send_due(factory, settings=settings)        # a periodic task, every few seconds
    send_one(factory, settings=settings, delivery_id=d.id)  # fast path, after the commit

Each run claims due rows in one short transaction (state ``sending``, ``attempts + 1``;
``FOR UPDATE SKIP LOCKED`` on PostgreSQL, so two workers never claim the same row), posts
them concurrently with no transaction open, then records each outcome in its own short
transaction. A receiver that is down therefore never holds a lock or slows ingest.

Outcomes: 2xx → ``delivered``. 408, 429, 5xx and network errors → ``pending`` again after
``webhook_backoff_s * 2**(attempts-1)`` seconds (at most 10 minutes, plus jitter; a longer
``Retry-After`` wins), ``failed`` after ``webhook_max_attempts``. Any other status → ``failed``
at once: a wrong URL or credential will not fix itself. Rows left in ``sending`` by a crashed
sender are claimed again after ``STUCK_AFTER_S``. Receiver problems are logged, never raised.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from datetime import datetime, timedelta
from urllib.parse import urlsplit

import httpx
from sqlalchemy import and_, or_, select
from sqlalchemy.orm import Session, sessionmaker

from backend import __version__
from backend.alerts import formats, sealing
from backend.alerts.models import WebhookDelivery, WebhookReceiver
from backend.db import session_scope, utcnow
from backend.settings import Settings

log = logging.getLogger(__name__)

STUCK_AFTER_S = 300  # a row in `sending` this long belongs to a sender that died
MAX_BACKOFF_S = 600
MAX_PARALLEL = 8  # concurrent requests per run
RETRY_CODES = frozenset({408, 429})
ERROR_CHARS = 500


@dataclass(frozen=True)
class Claimed:
    """What one request needs, copied out of the claim transaction."""

    delivery_id: int
    attempts: int
    status: str
    receiver: str
    format: str
    url: str
    secret: str | None
    webhook_id: str
    headers: dict[str, str]
    body: bytes


@dataclass(frozen=True)
class Outcome:
    code: int | None = None
    error: str | None = None
    retry: bool = False  # worth trying again
    retry_after_s: float | None = None

    @property
    def delivered(self) -> bool:
        return self.code is not None and 200 <= self.code < 300


def send_due(
    factory: sessionmaker[Session],
    *,
    settings: Settings,
    now: datetime | None = None,
    limit: int = 50,
) -> int:
    """Claim and post up to ``limit`` due deliveries; returns how many were attempted."""
    claimed = _claim(factory, now=now or utcnow(), limit=limit)
    _send_all(factory, claimed, settings=settings, now=now)
    return len(claimed)


def send_one(
    factory: sessionmaker[Session],
    *,
    settings: Settings,
    delivery_id: int,
    now: datetime | None = None,
) -> bool:
    """Post one pending delivery now (if it is due and no one else has it); True if the
    receiver accepted it. On failure it stays in the outbox for ``send_due`` to retry."""
    claimed = _claim(factory, now=now or utcnow(), limit=1, delivery_id=delivery_id)
    outcomes = _send_all(factory, claimed, settings=settings, now=now)
    return any(o.delivered for o in outcomes)


def _claim(
    factory: sessionmaker[Session], *, now: datetime, limit: int, delivery_id: int | None = None
) -> list[Claimed]:
    stuck = now - timedelta(seconds=STUCK_AFTER_S)
    due = or_(
        and_(WebhookDelivery.state == "pending", WebhookDelivery.next_attempt_at <= now),
        and_(WebhookDelivery.state == "sending", WebhookDelivery.last_attempt_at <= stuck),
    )
    query = select(WebhookDelivery).where(due)
    if delivery_id is not None:
        query = query.where(WebhookDelivery.id == delivery_id)
    # SQLite renders no FOR UPDATE (it has one writer at a time anyway).
    query = (
        query.order_by(WebhookDelivery.next_attempt_at, WebhookDelivery.id)
        .limit(limit)
        .with_for_update(skip_locked=True)
    )
    out: list[Claimed] = []
    with session_scope(factory, write=True) as session:
        rows = list(session.scalars(query))
        if not rows:
            return []
        ids = {r.receiver_id for r in rows}
        receivers = {
            r.id: r
            for r in session.scalars(select(WebhookReceiver).where(WebhookReceiver.id.in_(ids)))
        }
        for row in rows:
            receiver = receivers.get(row.receiver_id)
            if receiver is None or (not receiver.enabled and row.status != "test"):
                row.state, row.error = "failed", "receiver disabled before delivery"
                continue
            try:
                secret, headers = receiver.secret, receiver.headers
            except sealing.SecretUnreadable as exc:  # never send it unsigned instead
                row.state, row.error = "failed", str(exc)[:ERROR_CHARS]
                log.error("webhook %s: %s", receiver.name, exc)
                continue
            row.state, row.attempts, row.last_attempt_at = "sending", row.attempts + 1, now
            out.append(
                Claimed(
                    delivery_id=row.id,
                    attempts=row.attempts,
                    status=row.status,
                    receiver=receiver.name,
                    format=receiver.format,
                    url=receiver.url,
                    secret=secret,
                    webhook_id=row.webhook_id,
                    headers=headers,
                    body=formats.encode(row.payload),
                )
            )
    return out


def _send_all(
    factory: sessionmaker[Session],
    claimed: list[Claimed],
    *,
    settings: Settings,
    now: datetime | None,
) -> list[Outcome]:
    if not claimed:
        return []
    clock: Callable[[], datetime] = (lambda: now) if now is not None else utcnow
    outcomes: list[Outcome] = []
    timeout = httpx.Timeout(settings.webhook_timeout_s)
    with (
        httpx.Client(timeout=timeout, follow_redirects=False) as client,
        ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(claimed))) as pool,
    ):
        allowed = settings.allowed_webhook_hosts()
        futures = {pool.submit(post_if_allowed, client, c, allowed): c for c in claimed}
        for future in as_completed(futures):
            item = futures[future]
            outcome = future.result()  # post() never raises
            outcomes.append(outcome)
            try:
                _record(factory, item, outcome, settings=settings, now=clock())
            except Exception:  # the row stays `sending` and is claimed again later
                log.exception("could not record webhook delivery %s", item.delivery_id)
    return outcomes


def request_headers(item: Claimed, *, timestamp: int | None = None) -> dict[str, str]:
    """The receiver's extra headers, then ours (which win): JSON, user agent, and for the
    generic format the Standard Webhooks id, timestamp and signature."""
    ours = {"Content-Type": "application/json", "User-Agent": f"Vigil/{__version__}"}
    if item.format == "generic":
        ours.update(
            formats.signing_headers(item.secret, item.webhook_id, item.body, timestamp=timestamp)
        )
    lower = {k.lower() for k in ours}
    return {**{k: v for k, v in item.headers.items() if k.lower() not in lower}, **ours}


def post_if_allowed(client: httpx.Client, item: Claimed, allowed: frozenset[str]) -> Outcome:
    """``post``, unless ``VIGIL_WEBHOOK_HOSTS`` is set and the URL's host is not in it: then
    nothing is sent and the delivery fails with the reason (no retry)."""
    try:
        host = (urlsplit(item.url).hostname or "").lower()
    except ValueError:  # a malformed URL: post() reports it
        host = ""
    if allowed and host not in allowed:
        return Outcome(error=f"host {host!r} is not in VIGIL_WEBHOOK_HOSTS; not sent")
    return post(client, item)


def post(client: httpx.Client, item: Claimed) -> Outcome:
    """One attempt. Never raises: every problem becomes an ``Outcome``."""
    try:
        headers = request_headers(item, timestamp=int(time.time()))
        with client.stream("POST", item.url, content=item.body, headers=headers) as response:
            snippet = b""
            for chunk in response.iter_bytes():
                snippet += chunk
                if len(snippet) >= ERROR_CHARS:
                    break
        code = response.status_code
        if 200 <= code < 300:
            return Outcome(code=code)
        text = snippet.decode("utf-8", "replace").strip()
        error = f"HTTP {code}" + (f": {text}" if text else "")
        retry = code in RETRY_CODES or code >= 500
        return Outcome(
            code=code,
            error=error[:ERROR_CHARS],
            retry=retry,
            retry_after_s=_retry_after(response.headers.get("retry-after")),
        )
    except (httpx.UnsupportedProtocol, httpx.InvalidURL, ValueError) as exc:
        return Outcome(error=f"{type(exc).__name__}: {exc}"[:ERROR_CHARS], retry=False)
    except Exception as exc:  # connection refused, timeouts, TLS, DNS, …
        return Outcome(error=f"{type(exc).__name__}: {exc}"[:ERROR_CHARS], retry=True)


def _retry_after(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None  # the HTTP-date form is rare for webhooks; use our own backoff


def backoff_s(attempts: int, base_s: float, retry_after_s: float | None = None) -> float:
    """Delay before the next try: doubles per attempt, capped at 10 minutes, with up to 10%
    jitter; a longer ``Retry-After`` from the receiver wins (within the same cap)."""
    delay = float(min(base_s * 2 ** max(attempts - 1, 0), MAX_BACKOFF_S))
    if retry_after_s is not None:
        delay = max(delay, min(retry_after_s, MAX_BACKOFF_S))
    return float(delay + random.uniform(0, delay * 0.1))


def _record(
    factory: sessionmaker[Session],
    item: Claimed,
    outcome: Outcome,
    *,
    settings: Settings,
    now: datetime,
) -> None:
    with session_scope(factory, write=True) as session:
        query = select(WebhookDelivery).where(WebhookDelivery.id == item.delivery_id)
        row = session.scalar(query.with_for_update())
        if row is None or row.state != "sending" or row.attempts != item.attempts:
            return  # deleted, or reclaimed by another sender meanwhile
        row.response_code, row.error = outcome.code, outcome.error
        if outcome.delivered:
            row.state, row.delivered_at = "delivered", now
            log.info("webhook %s delivered to %s", row.id, item.receiver)
            return
        last = row.attempts >= settings.webhook_max_attempts or row.status == "test"
        if outcome.retry and not last:
            delay = backoff_s(row.attempts, settings.webhook_backoff_s, outcome.retry_after_s)
            row.state, row.next_attempt_at = "pending", now + timedelta(seconds=delay)
            log.warning(
                "webhook %s to %s failed (attempt %d, %s); retry in %.0f s",
                row.id,
                item.receiver,
                row.attempts,
                outcome.error,
                delay,
            )
        else:
            row.state = "failed"
            log.warning(
                "webhook %s to %s failed for good after %d attempt(s): %s",
                row.id,
                item.receiver,
                row.attempts,
                outcome.error,
            )
