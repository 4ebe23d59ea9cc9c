"""Overload through the relay must not silence live ranks (issue 16).

An overloaded server refuses a request with telemetry in it as a whole (429), and still
takes a request of heartbeat-only batches (its heartbeat lane). When the relay merged a
node's heartbeats and telemetry into one request, a throttled flush took every rank's
heartbeat down with it, and the hang sweep called the whole node crashed. Ranks are real
collector clients, and one more sender on the node always has telemetry to send (a rank
out of phase with the others: through the relay, a node's ranks fall into step, and
without it most flushes would hold one kind of batch only); the upstream is a stand-in
that refuses on cue (``overloaded_upstream``).
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import Counter

import httpx

from collector.client import Client
from collector.relay import Limits, Relay, RelayConfig
from tests.collector.overloaded_upstream import OverloadedUpstream
from tests.collector.relay_process import TOKEN, ranks

JOB = "relay-overload"
RANKS = 4
HEARTBEAT_S = 0.2
OVERLOAD_S = 1.5
SLACK_S = 0.8  # scheduling on a busy test machine; far below OVERLOAD_S


def shut(clients: list[Client]) -> None:
    threads = [threading.Thread(target=c.shutdown, kwargs={"timeout": 2}) for c in clients]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def chatter(url: str, stop: threading.Event) -> None:
    """A sender whose telemetry is always due: a fresh batch as soon as one is answered."""
    n = 0
    with httpx.Client(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10) as client:
        while not stop.is_set():
            event = {"type": "step", "step": n, "ts": time.time(), "duration_s": 0.1}
            body = {"batch_id": str(uuid.uuid4()), "job": "chatty", "rank": 0, "events": [event]}
            client.post(f"{url}/api/v1/ingest", content=json.dumps(body))
            n += 1
            time.sleep(0.01)


def test_heartbeats_get_through_every_flush_while_the_telemetry_waits():
    with OverloadedUpstream() as upstream:
        upstream.overloaded.set()
        config = RelayConfig(
            endpoint=upstream.url, token=TOKEN, port=0, limits=Limits(flush_s=0.05)
        )
        relay = Relay(config)
        relay.start()
        clients = ranks(relay.url, JOB, RANKS, heartbeat_s=HEARTBEAT_S, flush_s=0.05)
        stop = threading.Event()
        chatty = threading.Thread(target=chatter, args=(relay.url, stop), daemon=True)
        chatty.start()
        try:
            start = time.monotonic()
            steps = 0
            while time.monotonic() - start < OVERLOAD_S:  # training goes on meanwhile
                for client in clients:
                    client.begin_step(steps)
                time.sleep(0.01)
                for client in clients:
                    client.end_step()
                steps += 1
            end = time.monotonic()
            stop.set()
            chatty.join()
            upstream.overloaded.clear()
            assert all(c.flush(timeout=30) for c in clients)
        finally:
            stop.set()
            shut(clients)
            relay.stop(timeout=5)
        requests = upstream.snapshot()
        delivered = upstream.delivered()
    assert any(r.status == 429 for r in requests if r.at < end)  # telemetry was held back
    for rank in range(RANKS):
        beats = [
            r.at
            for r in requests
            if r.status == 200
            and start <= r.at <= end
            and any(b["rank"] == rank and heartbeat_in(b) for b in r.batches if b["job"] == JOB)
        ]
        gaps = [b - a for a, b in zip([start, *beats], [*beats, end], strict=True)]
        assert max(gaps) < HEARTBEAT_S + SLACK_S, f"rank {rank}: a gap of {max(gaps):.2f} s"
    # Once the server takes telemetry again every step arrives, each exactly once.
    ours = [b for b in delivered if b["job"] == JOB]
    stored = Counter((b["rank"], e["step"]) for b in ours for e in b["events"] if is_step(e))
    assert sorted(stored) == [(r, n) for r in range(RANKS) for n in range(steps)]
    assert set(stored.values()) == {1}
    assert relay.stats()["held_batches"] == 0


def heartbeat_in(batch: dict) -> bool:  # type: ignore[type-arg]
    return any(e["type"] == "heartbeat" for e in batch["events"])


def is_step(event: dict) -> bool:  # type: ignore[type-arg]
    return event["type"] == "step"
