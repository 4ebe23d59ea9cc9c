"""An overloaded server must not make a live rank look dead (issue 16).

Under load the server answers telemetry late and then refuses it (429), while it still
takes heartbeat-only batches (``backend.ingest.admission``). The collector's worker sends
one request at a time; a heartbeat that waited behind each slow telemetry request reached
the server once per request, not once per interval, and ranks looked silent long enough
to be called crashed. The endpoint is the fault-injecting stand-in (``faulty_ingest``).
"""

from __future__ import annotations

import threading
import time

import collector as vigil
from tests.collector.faulty_ingest import FaultyIngest

JOB = "overload"
HEARTBEAT_S = 0.2
SLOW_S = 1.5  # how long the overloaded server takes to refuse a telemetry batch
SLACK_S = 0.8  # scheduling on a busy test machine; far below SLOW_S


def test_heartbeats_keep_their_interval_while_telemetry_is_answered_late_and_refused():
    overloaded = threading.Event()
    overloaded.set()

    def telemetry(batch: dict) -> bool:  # type: ignore[type-arg]
        return any(e["type"] != "heartbeat" for e in batch["events"])

    throttled = (429, {"error": "throttled", "detail": "server saturated"}, {"Retry-After": "0"})
    with FaultyIngest() as ingest:
        ingest.fault = lambda b: throttled if overloaded.is_set() and telemetry(b) else None
        ingest.delay = lambda b: SLOW_S if overloaded.is_set() and telemetry(b) else 0.0
        vigil.init(
            job=JOB, endpoint=ingest.url, integrations=False, heartbeat_s=HEARTBEAT_S, flush_s=0.05
        )
        start = time.monotonic()
        steps = 0
        while time.monotonic() - start < SLOW_S + 1.0:  # training goes on meanwhile
            with vigil.step(steps):
                time.sleep(0.01)
            steps += 1
        end = time.monotonic()
        overloaded.clear()
        assert vigil.flush(timeout=30)
        calls = ingest.snapshot()
        delivered = ingest.delivered_steps()
    beats = [c.at for c in calls if c.heartbeat_only and c.status == 200 and start <= c.at <= end]
    gaps = [b - a for a, b in zip([start, *beats], [*beats, end], strict=True)]
    assert max(gaps) < HEARTBEAT_S + SLACK_S, f"a heartbeat gap of {max(gaps):.2f} s: {gaps}"
    refused = [c for c in calls if not c.heartbeat_only and c.status == 429]
    assert refused  # telemetry was held back, and answered late
    # Once the server recovers every step arrives, each exactly once.
    assert sorted(delivered) == list(range(steps))
    assert vigil.stats()["dropped"] == {}
