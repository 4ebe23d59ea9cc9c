"""Delivery under faults the network or server can throw at the collector (issue 13):
one batch the server never takes must not black out the rank, heartbeats and actions travel
apart from telemetry that is held back, a full buffer gives up the oldest telemetry, and a
refused token backs off without losing data. The endpoint is a fault-injecting stand-in
(``faulty_ingest``); the same scenarios against a real server are in tests/reliability/."""

from __future__ import annotations

import threading

import collector as vigil
from tests.collector.faulty_ingest import FaultyIngest, has_event, unprocessable, wait_until

JOB = "faults"
POISON = "checkpoint_saved\x00"


def run_steps(first: int, last: int, *, poison_at: int | None = None) -> None:
    for n in range(first, last):
        with vigil.step(n):
            if n == poison_at:
                vigil.event(POISON)
            vigil.event("tick", n=n)


def test_a_batch_answered_500_forever_is_set_aside_and_everything_else_arrives():
    with FaultyIngest() as ingest:
        ingest.fault = lambda batch: 500 if has_event(batch, POISON) else None
        vigil.init(job=JOB, endpoint=ingest.url, integrations=False, heartbeat_s=0.2)
        run_steps(0, 40, poison_at=20)  # one batch: the poison among 80 good events
        assert vigil.flush(timeout=30), "the poisoned batch blocked delivery"
        run_steps(40, 50)  # and later batches go as usual
        assert vigil.flush(timeout=10)

        assert sorted(ingest.delivered_steps()) == list(range(50))
        ticks = [e["attrs"]["n"] for e in ingest.delivered_events("event")]
        assert sorted(ticks) == list(range(50))
        stats = vigil.stats()
        assert stats["set_aside_batches"] == 1
        assert stats["dropped"] == {"failed": 1}  # the poisoned event alone
        assert "500" in stats["last_error"]
        # The rank reports it with its heartbeats (the server shows it per rank).
        wait_until(
            lambda: any(
                e.get("dropped") == {"failed": 1, "batches_set_aside": 1}
                for e in ingest.delivered_events("heartbeat")
            ),
            10,
            "a heartbeat reporting the batch set aside",
        )


def test_a_batch_id_the_server_already_holds_counts_as_delivered():
    """A resend whose first try landed (its reply lost) but that differs from it — sent
    without the heartbeat that rode along, or after its oldest events were dropped — gets
    the server's 409 ``batch_id_reused``: a version of it is stored, nothing is set aside."""
    body = {"error": "batch_id_reused", "detail": "batch_id x was stored with other content"}
    reused = (409, body, {})
    with FaultyIngest() as ingest:
        ingest.fault = lambda batch: (
            reused if any(e["type"] == "step" for e in batch["events"]) else None
        )
        vigil.init(job=JOB, endpoint=ingest.url, integrations=False, heartbeat_s=60)
        run_steps(0, 10)
        assert vigil.flush(timeout=10)
        stats = vigil.stats()
        assert stats["set_aside_batches"] == 0 and stats["dropped"] == {}, stats
        telemetry = [c for c in ingest.snapshot() if not c.heartbeat_only]
        assert len(telemetry) == 1  # taken as delivered: not sent again


def test_a_batch_answered_422_loses_only_the_events_it_names():
    with FaultyIngest() as ingest:
        ingest.fault = lambda batch: unprocessable(batch, POISON)
        vigil.init(job=JOB, endpoint=ingest.url, integrations=False, heartbeat_s=60)
        run_steps(0, 40, poison_at=20)
        assert vigil.flush(timeout=10)

        assert sorted(ingest.delivered_steps()) == list(range(40))
        ticks = [e["attrs"]["n"] for e in ingest.delivered_events("event")]
        assert sorted(ticks) == list(range(40))
        refused = [c for c in ingest.snapshot() if c.status != 200]
        assert len(refused) == 1  # refused once: never retried as it was
        stats = vigil.stats()
        assert stats["set_aside_batches"] == 1
        assert stats["dropped"] == {"rejected": 1}
        assert "422" in stats["last_error"] and "events[" in stats["last_error"]


def test_a_server_that_fails_every_step_costs_a_bounded_number_of_requests():
    """Isolating bad events halves a batch at a time; when every event is bad, a budget
    per batch stops the search long before one request per event."""
    with FaultyIngest() as ingest:
        ingest.fault = lambda batch: (
            500 if any(e["type"] == "step" for e in batch["events"]) else None
        )
        vigil.init(job=JOB, endpoint=ingest.url, integrations=False, heartbeat_s=60)
        for n in range(256):
            with vigil.step(n):
                pass
        assert vigil.flush(timeout=60)
        telemetry = [c for c in ingest.snapshot() if not c.heartbeat_only]
        assert len(telemetry) <= 80, len(telemetry)  # 256 events: budget 8 + 6 * 9 = 62
        stats = vigil.stats()
        assert stats["dropped"] == {"failed": 256}
        assert ingest.delivered_steps() == []


def test_heartbeats_and_actions_travel_while_telemetry_is_held_back():
    """Telemetry throttled for 30 s: liveness and actions do not wait for it."""
    ran = threading.Event()

    @vigil.on_action("checkpoint_now")
    def checkpoint(params):  # type: ignore[no-untyped-def]
        ran.set()
        return {"saved": True}

    with FaultyIngest() as ingest:
        telemetry_held = (429, {"error": "throttled"}, {"Retry-After": "30"})
        ingest.fault = lambda batch: (
            None if all(e["type"] == "heartbeat" for e in batch["events"]) else telemetry_held
        )
        ingest.actions = [{"id": "a-1", "kind": "checkpoint_now", "params": {}}]
        vigil.init(job=JOB, endpoint=ingest.url, integrations=False, heartbeat_s=0.2)
        run_steps(0, 10)
        wait_until(
            lambda: sum(c.heartbeat_only and c.status == 200 for c in ingest.snapshot()) >= 3,
            10,
            "heartbeats delivered while telemetry waits for Retry-After",
        )
        assert ran.wait(10), "the action in a heartbeat's reply did not reach its handler"
        beats = [e for e in ingest.delivered_events("heartbeat")]
        assert beats[-1]["step"] >= 9  # the heartbeat knows where training is
        assert ingest.delivered_steps() == []  # still held back: the server said so


def test_when_the_buffer_overflows_the_oldest_telemetry_goes():
    ingest = FaultyIngest()  # down: nothing listens yet
    vigil.init(job=JOB, endpoint=ingest.url, integrations=False, heartbeat_s=0.2, max_queue=100)
    for n in range(300):
        with vigil.step(n):
            pass
        if n % 10 == 0:
            threading.Event().wait(0.002)  # let the worker take what was handed over
    ingest.start()
    try:
        assert vigil.flush(timeout=20)
        # The newest 100 steps are kept: the server learns the present, not the past.
        assert ingest.delivered_steps() == list(range(200, 300))
        assert vigil.stats()["dropped"] == {"buffer_full": 200}
    finally:
        ingest.stop()


def test_a_refused_token_backs_off_and_keeps_the_data():
    with FaultyIngest() as ingest:
        refusing = threading.Event()
        refusing.set()
        ingest.fault = lambda batch: 401 if refusing.is_set() else None
        vigil.init(job=JOB, endpoint=ingest.url, integrations=False, heartbeat_s=0.1, flush_s=0.05)
        run_steps(0, 10)
        threading.Event().wait(3)
        # Heartbeats every 0.1 s would be 30 requests: a refused token is not retried at
        # that pace (backoff from 1 s, doubling).
        assert 1 <= len(ingest.snapshot()) <= 6, len(ingest.snapshot())
        assert "401" in (vigil.stats()["last_error"] or "")
        refusing.clear()  # the token is fixed on the server
        assert vigil.flush(timeout=20)
        assert sorted(ingest.delivered_steps()) == list(range(10))
        assert vigil.stats()["dropped"] == {}


def test_a_batch_stored_but_answered_too_late_is_resent_whole_never_split():
    """A server too slow for the collector's timeout stores the batch but its answer never
    arrives, while heartbeats get through. Seen at 512 ranks: the collector struck the
    batch as bad, split it into halves with new batch ids, and the server stored 18 steps
    twice. An unanswered request is no sign of a bad batch: it goes again whole, same id."""
    slow = {"left": 4}

    def delay(batch: dict) -> float:  # type: ignore[type-arg]
        if any(e["type"] == "step" for e in batch["events"]) and slow["left"] > 0:
            slow["left"] -= 1
            return 1.0
        return 0.0

    with FaultyIngest() as ingest:
        ingest.delay = delay
        vigil.init(job=JOB, endpoint=ingest.url, integrations=False, heartbeat_s=0.1, timeout_s=0.3)
        run_steps(0, 40)
        assert vigil.flush(timeout=30)
        steps = ingest.delivered_steps()  # once per batch id, as the server counts
        assert sorted(steps) == list(range(40)), f"stored twice: {len(steps) - len(set(steps))}"
        tries = [c for c in ingest.snapshot() if not c.heartbeat_only]
        assert len({c.batch["batch_id"] for c in tries}) == 1 and len(tries) == 5
        assert vigil.stats()["set_aside_batches"] == 0
