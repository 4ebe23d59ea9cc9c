"""The collector against a real server: what it sends arrives once, outages lose nothing
(within the bounded buffer), and the job never waits for the backend."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

import httpx
import pytest

import collector as vigil
from tests.conftest import ADMIN
from tests.servers import free_port, live_server, live_server_on

JOB = "collector-test"


def steps_of(base: str, job: str = JOB) -> list[dict]:
    page = httpx.get(
        f"{base}/api/v1/jobs/{job}/steps", params={"limit": 10_000}, headers=ADMIN
    ).json()
    return page["items"]


def test_without_endpoint_everything_is_a_no_op(monkeypatch):
    monkeypatch.delenv("VIGIL_ENDPOINT", raising=False)
    threads = threading.active_count()
    assert vigil.init(job="x") is False
    with vigil.step(1):
        vigil.log(loss=1.0)
    vigil.request("r1", arrival=0.0, end=1.0)
    vigil.event("checkpoint_saved")
    assert vigil.flush() is True
    assert vigil.get_client() is None
    assert threading.active_count() == threads


def test_steps_metrics_and_heartbeats_arrive(sqlite_url):
    with live_server(sqlite_url) as base:
        assert vigil.init(
            job=JOB, endpoint=base, token="vigil-dev-ingest", heartbeat_s=0.2, integrations=False
        )
        for n in range(20):
            with vigil.step(n):
                time.sleep(0.001)
            vigil.log(loss=3.0 - n * 0.1, lr=1e-4)  # after the step, as in the README
        vigil.request("r-1", arrival=1.0, first_token=1.2, end=2.0, output_tokens=10)
        assert vigil.flush(timeout=10)
        time.sleep(0.5)  # let a heartbeat go out
        steps = steps_of(base)
        assert [s["step"] for s in steps] == list(range(20))
        assert steps[5]["loss"] == pytest.approx(2.5)
        assert all(s["duration_s"] >= 0.001 and s["mem_bytes"] > 0 for s in steps)
        ranks = httpx.get(f"{base}/api/v1/jobs/{JOB}/ranks", headers=ADMIN).json()
        assert ranks[0]["last_heartbeat_ts"] is not None
        assert ranks[0]["pid"] == os.getpid()
        assert ranks[0]["last_step"] == 19


def test_outage_loses_nothing_and_duplicates_nothing(sqlite_url):
    """Kill the server mid-run: training goes on, data arrives after it restarts, once."""
    port = free_port()
    with live_server_on(sqlite_url, port) as base:
        vigil.init(
            job=JOB, endpoint=base, token="vigil-dev-ingest", integrations=False, flush_s=0.05
        )
        for n in range(30):
            with vigil.step(n):
                pass
        assert vigil.flush(timeout=10)
    # The server is gone. The job keeps stepping; nothing blocks.
    for n in range(30, 60):
        with vigil.step(n):
            pass
    assert vigil.flush(timeout=0.5) is False  # cannot be delivered now
    with live_server_on(sqlite_url, port) as base:
        assert vigil.flush(timeout=30)
        steps = [s["step"] for s in steps_of(base)]
    assert sorted(steps) == list(range(60))  # every step, exactly once


def test_buffer_is_bounded_and_drops_are_counted():
    port = free_port()  # nothing listens here
    vigil.init(
        job=JOB,
        endpoint=f"http://127.0.0.1:{port}",
        integrations=False,
        max_queue=100,
        heartbeat_s=0.1,
    )
    client = vigil.get_client()
    assert client is not None
    for n in range(1000):
        vigil.log(step=n, throughput=float(n))
    stats = vigil.stats()
    # Held: the worker's buffer (at most 100) plus what it has not taken over yet.
    assert stats["buffered"] <= 200
    assert sum(stats["dropped"].values()) >= 800
    beat = client._tick()[0]
    assert sum(beat["dropped"].values()) >= 800  # and reported with the next heartbeat


class _Throttling(BaseHTTPRequestHandler):
    """A stand-in ingest endpoint that answers the first telemetry batch 429 with
    Retry-After, then 200."""

    calls: list[tuple[float, str]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        batch = json.loads(
            __import__("gzip").decompress(body)
            if self.headers.get("Content-Encoding") == "gzip"
            else body
        )
        if all(e["type"] == "heartbeat" for e in batch["events"]):
            calls = 0  # heartbeats travel on their own: not the batch under test
        else:
            _Throttling.calls.append((time.monotonic(), batch["batch_id"]))
            calls = len(_Throttling.calls)
        if calls == 1:
            self.send_response(429)
            self.send_header("Retry-After", "1")
            self.end_headers()
            return
        reply = b'{"accepted": 1, "duplicate": false, "actions": []}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args: object) -> None:
        pass


def test_429_retry_after_is_honoured_with_the_same_batch_id():
    """Protocol check with a stand-in endpoint: a real server cannot be made to throttle
    on cue. The real server's 429 is tested in tests/backend/ingest/test_ingest_limits.py."""
    _Throttling.calls = []
    server = HTTPServer(("127.0.0.1", 0), _Throttling)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        vigil.init(
            job=JOB,
            endpoint=f"http://127.0.0.1:{server.server_port}",
            integrations=False,
            heartbeat_s=60,
        )
        with vigil.step(0):
            pass
        assert vigil.flush(timeout=10)
    finally:
        server.shutdown()
    (t0, first), (t1, second) = _Throttling.calls[:2]
    assert first == second  # a retry, not a new batch
    assert t1 - t0 >= 0.9


def test_collector_survives_fork(sqlite_url):
    with live_server(sqlite_url) as base:
        vigil.init(job=JOB, endpoint=base, token="vigil-dev-ingest", integrations=False)
        with vigil.step(0):
            pass
        pid = os.fork()
        if pid == 0:  # the child: its own thread ships its own events
            try:
                vigil.event("from_child", pid=os.getpid())
                os._exit(0 if vigil.flush(timeout=10) else 1)
            except BaseException:
                os._exit(2)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert vigil.flush(timeout=10)


def test_exit_at_interpreter_shutdown_flushes(sqlite_url, tmp_path):
    script = tmp_path / "job.py"
    script.write_text(
        "import collector as vigil\n"
        "vigil.init(integrations=False)\n"
        "for n in range(5):\n"
        "    with vigil.step(n):\n"
        "        pass\n"
    )
    with live_server(sqlite_url) as base:
        env = {
            **os.environ,
            "VIGIL_ENDPOINT": base,
            "VIGIL_TOKEN": "vigil-dev-ingest",
            "VIGIL_JOB": JOB,
            "VIGIL_HEARTBEAT_S": "60",
            "VIGIL_FLUSH_S": "60",
        }
        subprocess.run([sys.executable, str(script)], env=env, check=True, timeout=60)
        assert [s["step"] for s in steps_of(base)] == [0, 1, 2, 3, 4]
