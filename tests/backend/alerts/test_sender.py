"""Sending: a real local HTTP receiver, retries with backoff, and receivers that are down."""

from __future__ import annotations

import json
import time
from datetime import timedelta

import pytest
from sqlalchemy import select

from backend.alerts import formats
from backend.alerts.models import WebhookDelivery, WebhookReceiver
from backend.alerts.sender import STUCK_AFTER_S, send_due, send_one
from backend.alerts.service import notify_changes
from tests.backend.alerts.conftest import T0, make_incident, make_receiver
from tests.servers import free_port

URL = "https://vigil.example"


@pytest.fixture
def fast(settings):  # type: ignore[no-untyped-def]
    return settings.model_copy(
        update={"webhook_timeout_s": 0.5, "webhook_backoff_s": 2.0, "webhook_max_attempts": 3}
    )


def outbox(session, url, **receiver):  # type: ignore[no-untyped-def]
    """One receiver, one open incident, its firing delivery committed; returns the row."""
    make_receiver(session, "rx", url=url, **receiver)
    row = make_incident(session)
    [delivery] = notify_changes(session=session, opened=[row], resolved=[], now=T0, public_url=URL)
    session.commit()
    return delivery


def reload(session, delivery):  # type: ignore[no-untyped-def]
    session.expire_all()
    return session.scalar(select(WebhookDelivery).where(WebhookDelivery.id == delivery.id))


def test_delivered_with_the_frozen_bytes_and_extra_headers(
    session, session_factory, fast, receiver_server
):
    delivery = outbox(
        session, receiver_server.url, headers={"Authorization": "Bearer s3cret", "X-Team": "ml"}
    )
    assert send_due(session_factory, settings=fast, now=T0) == 1
    [req] = receiver_server.requests
    assert req.body == formats.encode(delivery.payload)
    assert json.loads(req.body)["alerts"][0]["status"] == "firing"
    assert req.headers["content-type"] == "application/json"
    assert (req.headers["authorization"], req.headers["x-team"]) == ("Bearer s3cret", "ml")
    assert "webhook-signature" not in req.headers  # only the generic format signs
    row = reload(session, delivery)
    assert (row.state, row.attempts, row.response_code, row.error) == ("delivered", 1, 200, None)
    assert row.delivered_at == T0
    assert send_due(session_factory, settings=fast, now=T0 + timedelta(hours=1)) == 0


def test_generic_is_signed_and_retries_keep_id_and_bytes(
    session, session_factory, fast, receiver_server
):
    receiver_server.answer(500)
    delivery = outbox(session, receiver_server.url, format="generic")
    secret = session.get(WebhookReceiver, delivery.receiver_id).secret
    assert send_due(session_factory, settings=fast, now=T0) == 1
    assert send_due(session_factory, settings=fast, now=T0 + timedelta(seconds=5)) == 1
    first, second = receiver_server.requests
    assert first.body == second.body
    assert first.headers["webhook-id"] == second.headers["webhook-id"] == delivery.webhook_id
    for req in (first, second):
        assert formats.verify(
            secret,
            req.headers["webhook-id"],
            req.headers["webhook-timestamp"],
            req.body,
            req.headers["webhook-signature"],
        )
        assert not formats.verify(
            formats.new_secret(),
            req.headers["webhook-id"],
            req.headers["webhook-timestamp"],
            req.body,
            req.headers["webhook-signature"],
        )
    assert reload(session, delivery).state == "delivered"


def test_retry_with_backoff_after_a_500_then_delivered(
    session, session_factory, fast, receiver_server
):
    receiver_server.answer(500)
    delivery = outbox(session, receiver_server.url)
    assert send_due(session_factory, settings=fast, now=T0) == 1
    row = reload(session, delivery)
    assert (row.state, row.attempts, row.response_code) == ("pending", 1, 500)
    assert row.error == "HTTP 500: receiver says no"
    assert T0 + timedelta(seconds=2) <= row.next_attempt_at <= T0 + timedelta(seconds=2.2)
    assert send_due(session_factory, settings=fast, now=T0 + timedelta(seconds=1)) == 0
    assert send_due(session_factory, settings=fast, now=T0 + timedelta(seconds=3)) == 1
    row = reload(session, delivery)
    assert (row.state, row.attempts, row.response_code, row.error) == ("delivered", 2, 200, None)
    assert len(receiver_server.requests) == 2


def test_failed_after_max_attempts_with_doubling_delays(
    session, session_factory, fast, receiver_server
):
    receiver_server.answer(503, 502, 500, 500)
    delivery = outbox(session, receiver_server.url)
    now, delays = T0, []
    for _ in range(3):
        assert send_due(session_factory, settings=fast, now=now) == 1
        row = reload(session, delivery)
        if row.state == "pending":
            delays.append((row.next_attempt_at - now).total_seconds())
            now = row.next_attempt_at
    assert (row.state, row.attempts, row.response_code) == ("failed", 3, 500)
    assert 2 <= delays[0] <= 2.2 and 4 <= delays[1] <= 4.4
    assert send_due(session_factory, settings=fast, now=now + timedelta(days=1)) == 0
    assert len(receiver_server.requests) == 3


@pytest.mark.parametrize("code", [400, 401, 404, 410])
def test_other_4xx_fails_at_once(session, session_factory, fast, receiver_server, code):
    receiver_server.answer(code)
    delivery = outbox(session, receiver_server.url)
    assert send_due(session_factory, settings=fast, now=T0) == 1
    row = reload(session, delivery)
    assert (row.state, row.attempts, row.response_code) == ("failed", 1, code)


def test_429_retries_no_sooner_than_retry_after(session, session_factory, fast, receiver_server):
    receiver_server.answer(429, **{"Retry-After": "120"})
    delivery = outbox(session, receiver_server.url)
    send_due(session_factory, settings=fast, now=T0)
    row = reload(session, delivery)
    assert (row.state, row.response_code) == ("pending", 429)
    assert row.next_attempt_at >= T0 + timedelta(seconds=120)


def test_connection_refused_only_schedules_a_retry(session, session_factory, fast):
    delivery = outbox(session, f"http://127.0.0.1:{free_port()}/hook")
    started = time.monotonic()
    assert send_due(session_factory, settings=fast, now=T0) == 1
    assert time.monotonic() - started < 2
    row = reload(session, delivery)
    assert (row.state, row.attempts, row.response_code) == ("pending", 1, None)
    assert "ConnectError" in row.error
    assert row.next_attempt_at > T0


def test_a_receiver_that_never_answers_times_out(session, session_factory, fast, receiver_server):
    receiver_server.hang = True
    delivery = outbox(session, receiver_server.url)
    started = time.monotonic()
    assert send_due(session_factory, settings=fast, now=T0) == 1
    assert time.monotonic() - started < 3  # webhook_timeout_s=0.5
    row = reload(session, delivery)
    assert (row.state, row.response_code) == ("pending", None)
    assert "Timeout" in row.error


def test_one_slow_receiver_does_not_hold_up_the_others(
    session, session_factory, fast, receiver_server
):
    make_receiver(session, "down", url=f"http://127.0.0.1:{free_port()}/hook")
    make_receiver(session, "up", url=receiver_server.url)
    rows = notify_changes(
        session=session, opened=[make_incident(session)], resolved=[], now=T0, public_url=URL
    )
    session.commit()
    assert send_due(session_factory, settings=fast, now=T0) == 2
    states = sorted(reload(session, d).state for d in rows)
    assert states == ["delivered", "pending"]


def test_rows_stuck_in_sending_are_claimed_again(session, session_factory, fast, receiver_server):
    delivery = outbox(session, receiver_server.url)
    row = reload(session, delivery)
    row.state, row.attempts, row.last_attempt_at = "sending", 1, T0  # a sender died here
    session.commit()
    assert send_due(session_factory, settings=fast, now=T0 + timedelta(seconds=60)) == 0
    later = T0 + timedelta(seconds=STUCK_AFTER_S + 1)
    assert send_due(session_factory, settings=fast, now=later) == 1
    assert (reload(session, delivery).state, reload(session, delivery).attempts) == (
        "delivered",
        2,
    )


def test_send_one_fast_path(session, session_factory, fast, receiver_server):
    receiver_server.answer(500)
    delivery = outbox(session, receiver_server.url)
    assert not send_one(session_factory, settings=fast, delivery_id=delivery.id, now=T0)
    assert not send_one(session_factory, settings=fast, delivery_id=delivery.id, now=T0)  # not due
    assert len(receiver_server.requests) == 1
    later = T0 + timedelta(seconds=10)
    assert send_one(session_factory, settings=fast, delivery_id=delivery.id, now=later)
    assert reload(session, delivery).state == "delivered"


def test_disabled_receiver_is_not_called(session, session_factory, fast, receiver_server):
    delivery = outbox(session, receiver_server.url)
    session.get(WebhookReceiver, delivery.receiver_id).enabled = False
    session.commit()
    assert send_due(session_factory, settings=fast, now=T0) == 0
    assert receiver_server.requests == []
    assert reload(session, delivery).state == "failed"


def test_bad_url_fails_at_once(session, session_factory, fast):
    delivery = outbox(session, "ftp://example.invalid/hook")
    send_due(session_factory, settings=fast, now=T0)
    row = reload(session, delivery)
    assert (row.state, row.attempts) == ("failed", 1)
    assert "UnsupportedProtocol" in row.error


@pytest.mark.postgres
def test_two_senders_never_claim_the_same_row(engine, fast, receiver_server):
    """Real concurrent transactions (committed, then cleaned up): the claim skips rows
    another sender holds locked."""
    if engine.dialect.name != "postgresql":
        pytest.skip("SKIP LOCKED is PostgreSQL's; SQLite has one writer at a time")
    from backend.db import make_sessionmaker

    factory = make_sessionmaker(engine)
    with factory() as setup:
        rx = make_receiver(setup, "rx-concurrent", url=receiver_server.url)
        [delivery] = notify_changes(
            session=setup,
            opened=[make_incident(setup, job="concurrent-job")],
            resolved=[],
            now=T0,
            public_url=URL,
        )
        setup.commit()
    try:
        with factory() as holder:
            query = select(WebhookDelivery).where(WebhookDelivery.id == delivery.id)
            holder.scalar(query.with_for_update())  # another sender mid-claim
            assert send_due(factory, settings=fast, now=T0) == 0
            holder.rollback()
        assert send_due(factory, settings=fast, now=T0) == 1
        assert len(receiver_server.requests) == 1
    finally:
        with factory() as cleanup:
            from backend.jobs.models import Job

            cleanup.delete(cleanup.get(WebhookReceiver, rx.id))
            cleanup.execute(Job.__table__.delete().where(Job.name == "concurrent-job"))
            cleanup.commit()
