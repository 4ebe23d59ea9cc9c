"""The per-host relay (issue 16, item 2) between real collector clients and a real server:
a node's ranks cost the server one request per flush, each rank's batches are stored once,
and an action reaches exactly the rank it targets. Relay and server are real processes;
the ranks are ``collector.Client``s, one per simulated rank."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator

import httpx
import pytest

from tests.collector.relay_process import RelayProcess, ranks, server_requests
from tests.conftest import ADMIN
from tests.reliability.stack import stored_steps
from tests.servers import live_server

RANKS = 8


def run_steps(clients, steps: int, pause_s: float = 0.02) -> None:  # type: ignore[no-untyped-def]
    for n in range(steps):
        for client in clients:
            client.begin_step(n)
        time.sleep(pause_s)
        for client in clients:
            client.end_step()


def shut(clients) -> None:  # type: ignore[no-untyped-def]
    """Every rank's exit at once, as a job's ranks end together."""
    threads = [threading.Thread(target=c.shutdown, kwargs={"timeout": 2}) for c in clients]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """One ``vigil server`` (SQLite) for the module: (base URL, database URL)."""
    url = f"sqlite:///{tmp_path_factory.mktemp('relay') / 'vigil.db'}"
    with live_server(url) as base:
        yield base, url


@pytest.mark.timeout(120)
def test_a_node_of_ranks_costs_the_server_one_request_per_flush(tmp_path, server):
    base, db_url = server
    steps = 60
    before = server_requests(base)
    relay = RelayProcess(base, tmp_path).start()
    clients = ranks(relay.url, "merged", RANKS, heartbeat_s=0.5, flush_s=0.2)
    try:
        run_steps(clients, steps)
        assert all(c.flush(timeout=30) for c in clients)
        shut(clients)
        stats, after = relay.stats(), server_requests(base)
    finally:
        shut(clients)
        relay.stop()
    rows = Counter(stored_steps(db_url, "merged"))
    assert sorted(rows) == [(r, n) for r in range(RANKS) for n in range(steps)]
    assert set(rows.values()) == {1}  # each step once
    # Every rank request went through the relay, merged: the server saw the relay's
    # requests and no other, several ranks' batches in each.
    assert after["single"] == before["single"]
    assert after["multi"] - before["multi"] == stats["upstream_requests"]
    assert stats["received"] == stats["forwarded"] > 0  # all answered by the server
    merged = stats["forwarded"] / stats["upstream_requests"]
    print(f"relay: {stats['forwarded']} batches in {stats['upstream_requests']} requests")
    assert merged >= RANKS / 2, stats


@pytest.mark.timeout(120)
def test_an_action_reaches_only_the_rank_it_targets(tmp_path, server):
    base, _ = server
    ran: dict[int, list[int]] = {}
    lock = threading.Lock()
    before = server_requests(base)
    relay = RelayProcess(base, tmp_path).start()
    clients = ranks(relay.url, "routed", 4, heartbeat_s=0.2, flush_s=0.2)
    for client in clients:

        def mark(params: dict, rank: int = client.config.rank) -> dict:
            with lock:
                ran.setdefault(rank, []).append(params["n"])
            return {"rank": rank}

        client.register_action("mark", mark)
    try:
        run_steps(clients, 5)
        assert all(c.flush(timeout=30) for c in clients)
        action = {"kind": "mark", "target_ranks": [2], "params": {"n": 7}, "reason": "test"}
        created = httpx.post(f"{base}/api/v1/jobs/routed/actions", json=action, headers=ADMIN)
        assert created.status_code == 201, created.text
        url = f"{base}/api/v1/actions/{created.json()['id']}"
        deadline = time.monotonic() + 30
        while (done := httpx.get(url, headers=ADMIN).json())["state"] != "succeeded":
            assert time.monotonic() < deadline, done
            time.sleep(0.2)
        time.sleep(1.0)  # several more heartbeats from every rank
        after = server_requests(base)
    finally:
        shut(clients)
        relay.stop()
    assert ran == {2: [7]}
    assert list(done["deliveries"]) == ["2"] and done["result"] == {"2": {"rank": 2}}
    assert after["single"] == before["single"] and after["multi"] > before["multi"]


def test_a_full_relay_answers_429_and_a_stalled_server_503(tmp_path):
    """Bounded memory: past its limit the relay refuses at once (the rank keeps its batch
    and retries); a rank whose batch the server does not answer in time hears 503."""
    import socket

    from collector.relay import Limits, Relay, RelayConfig

    with socket.socket() as stalled:  # accepts connections, never answers
        stalled.bind(("127.0.0.1", 0))
        stalled.listen(16)
        upstream = f"http://127.0.0.1:{stalled.getsockname()[1]}"
        config = RelayConfig(
            endpoint=upstream,
            token="t",
            port=0,
            limits=Limits(flush_s=0.05, max_batches=2),
            reply_timeout_s=1.0,
            upstream_timeout_s=3.0,
        )
        relay = Relay(config)
        relay.start()
        try:
            post = lambda body: httpx.post(  # noqa: E731
                f"{relay.url}/api/v1/ingest",
                content=body,
                headers={"Authorization": "Bearer t"},
                timeout=10,
            )
            replies: list[httpx.Response] = []
            threads = [
                threading.Thread(target=lambda r=r: replies.append(post(b'{"rank": %d}' % r)))
                for r in (0, 1)
            ]
            for t in threads:  # rank 0's batch goes upstream and hangs; rank 1's waits
                t.start()
                time.sleep(0.2)
            full = post(b'{"rank": 2}')
            assert full.status_code == 429 and full.headers["Retry-After"] == "1"
            assert "buffer full" in full.json()["detail"]
            for t in threads:
                t.join()
            assert [r.status_code for r in replies] == [503, 503]
            assert {r.headers["Retry-After"] for r in replies} == {"1"}
            wrong = httpx.post(f"{relay.url}/api/v1/ingest", content=b"{}", timeout=5)
            assert wrong.status_code == 401
            assert relay.stats()["refused_full"] == 1
        finally:
            relay.stop(timeout=1)
