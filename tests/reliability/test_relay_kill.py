"""The per-host relay killed (``kill -9``) and restarted on its port, then the server killed
and restarted, while real collector clients stream steps through the relay: every step the
ranks made is stored exactly once, and nothing is dropped.

The relay acknowledges a batch to its rank only after the server did, and keeps nothing of
its own: what it held when it died was still in the ranks' buffers, and they send it again
with the same ``batch_id`` — to the new relay, which forwards the same bytes, so what the
server already stored is a duplicate, stored once (issue 16, item 2).
"""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest

from tests.collector.relay_process import RelayProcess, ranks
from tests.reliability.stack import VigilStack, stored_steps, wait_for

RANKS, STEPS = 6, 300


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_relay_and_server_kills_lose_nothing_and_store_nothing_twice(tmp_path, reliability_db):
    stack = VigilStack(tmp_path, db_url=reliability_db, redis_url=None, VIGIL_LOG_LEVEL="WARNING")
    relay: RelayProcess | None = None
    clients = []
    try:
        stack.start_server()
        relay = RelayProcess(stack.base, tmp_path).start()
        clients = ranks(relay.url, "kill-relay", RANKS, heartbeat_s=0.5, flush_s=0.1)

        def train() -> None:
            for n in range(STEPS):
                for client in clients:
                    client.begin_step(n)
                time.sleep(0.03)
                for client in clients:
                    client.end_step()

        trainer = threading.Thread(target=train)
        trainer.start()
        total = RANKS * STEPS
        stored = lambda: len(stored_steps(reliability_db, "kill-relay"))  # noqa: E731
        wait_for(lambda: stored() >= 0.25 * total, 60, "25% of the steps stored")
        relay.kill9()
        time.sleep(0.5)
        relay.start()
        wait_for(lambda: stored() >= 0.55 * total, 90, "55% of the steps stored")
        stack.kill9("server")
        time.sleep(0.5)
        stack.start_server()
        trainer.join(timeout=120)
        assert all(c.flush(timeout=120) for c in clients)
        reports = [c.stats() for c in clients]
        relay_stats = relay.stats()
    finally:
        for client in clients:
            client.shutdown(timeout=1)
        if relay is not None:
            relay.stop()
        stack.stop()

    assert all(not r["dropped"] for r in reports), reports
    rows = Counter(stored_steps(reliability_db, "kill-relay"))
    dupes = sorted(k for k, n in rows.items() if n > 1)
    missing = sorted({(r, n) for r in range(RANKS) for n in range(STEPS)} - set(rows))
    print(
        f"durability | relay kill -9 + server kill -9 | {total} steps | "
        f"{sum(rows.values())} stored | {len(dupes)} dup | relay after restart: {relay_stats}"
    )
    assert not dupes, f"{len(dupes)} steps stored twice, e.g. {dupes[:5]}"
    assert not missing, f"{len(missing)} steps missing, e.g. {missing[:5]}"
    assert sum(rows.values()) == total
    assert relay.starts == 2 and stack.started["server"] == 2
