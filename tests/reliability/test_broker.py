"""Redis and PostgreSQL restart under traffic, with a real distributed Vigil (API, Celery
worker, beat): the processes ride it out (the same pids are alive afterwards), every batch
the API acknowledged is stored exactly once (the sender retries what was not
acknowledged, as the collector does), detection still works afterwards, and ``/readyz``
says ready again.

Redis here keeps nothing across a restart (no RDB, no AOF), as in docker-compose.yml: queued
tasks and debounce keys are lost with it, and Vigil must not depend on them.
"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter

import pytest

from tests.reliability.stack import (
    Traffic,
    VigilStack,
    log_size,
    metric,
    stored_steps,
    straggler_batches,
    straggler_incidents,
    wait_for,
    wait_log,
)

FAST = {"VIGIL_DETECT_INTERVAL_S": "0.5", "VIGIL_SWEEP_INTERVAL_S": "1"}


def start(stack: VigilStack) -> None:
    stack.start_worker()
    stack.start_beat()
    stack.start_server()
    wait_log(stack, "worker", " ready.", 60)


def assert_exactly_once(db_url: str, job: str, acked: int, fault: str) -> None:
    rows = stored_steps(db_url, job)
    dupes = {k: n for k, n in Counter(rows).items() if n > 1}
    print(f"durability | {fault} | {acked} acknowledged | {len(rows)} stored | {len(dupes)} dup")
    assert not dupes, f"stored twice: {sorted(dupes)[:10]}"
    assert len(rows) == acked, f"{acked} steps acknowledged, {len(rows)} stored"


def assert_detects(stack: VigilStack, job: str) -> None:
    """A straggler ingested now is found by the worker (the API detects nothing itself)."""
    for body in straggler_batches(job):
        assert stack.ingest(body).status_code == 200
    found = wait_for(
        lambda: straggler_incidents(stack.base, job),
        30,
        f"straggler incident for {job}\nworker:\n{stack.tail('worker')}",
    )
    assert found[0]["ranks"] == [2]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_worker_rides_out_redis_restarts_under_traffic(tmp_path, redis_server, reliability_db):
    stack = VigilStack(tmp_path, db_url=reliability_db, redis_url=redis_server.url, **FAST)
    try:
        start(stack)
        worker, beat, server = stack.procs["worker"], stack.procs["beat"], stack.procs["server"]
        assert_detects(stack, "before")
        mark = log_size(stack, "worker")
        with Traffic(stack.base, job="steady") as traffic:
            wait_for(lambda: traffic.acked >= 40, 30, "traffic flowing")
            redis_server.restart(down_s=1.0)  # SIGTERM: a clean restart
            wait_for(lambda: traffic.acked >= 120, 30, "traffic after the first restart")
            redis_server.restart(down_s=1.0, kill=True)  # SIGKILL: a crash
            wait_for(lambda: traffic.acked >= 200, 30, "traffic after the second restart")
        # Both restarts reached the worker, and it reconnected instead of dying.
        wait_log(stack, "worker", "Connection to broker lost", 10, after=mark)
        assert worker.poll() is None, f"worker died:\n{stack.tail('worker')}"
        assert beat.poll() is None, f"beat died:\n{stack.tail('beat')}"
        assert server.poll() is None, f"server died:\n{stack.tail('server')}"
        assert "Unrecoverable error" not in stack.tail("worker", 400)

        assert_exactly_once(reliability_db, "steady", traffic.acked, "2 Redis restarts")
        assert_detects(stack, "after")
        ready = stack.wait_ready(30)
        assert ready["workers"] >= 1 and ready["beat"] >= 1
        assert metric(stack.base, "vigil_worker_alive") == 1
        assert metric(stack.base, "vigil_beat_alive") == 1
        for role in ("worker", "beat"):  # the compose healthchecks
            check = [sys.executable, "-m", "backend.readiness", role]
            assert subprocess.run(check, env=stack.env, timeout=60).returncode == 0, role
    finally:
        stack.stop()


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_api_and_worker_ride_out_a_postgres_crash_under_traffic(tmp_path, redis_server, pg_server):
    stack = VigilStack(tmp_path, db_url=pg_server.url, redis_url=redis_server.url, **FAST)
    try:
        start(stack)
        worker, beat, server = stack.procs["worker"], stack.procs["beat"], stack.procs["server"]
        with Traffic(stack.base, job="steady") as traffic:
            wait_for(lambda: traffic.acked >= 40, 30, "traffic flowing")
            pg_server.restart(down_s=2.0, immediate=True)  # a crash: WAL recovery on start
            wait_for(lambda: traffic.acked >= 120, 60, "traffic after the restart")
        assert traffic.retries > 0, "the crash never reached the sender: nothing was tested"
        assert worker.poll() is None, f"worker died:\n{stack.tail('worker')}"
        assert beat.poll() is None and server.poll() is None

        assert_exactly_once(pg_server.url, "steady", traffic.acked, "PostgreSQL crash")
        assert_detects(stack, "after-pg")
        assert stack.wait_ready(30)["status"] == "ready"
    finally:
        stack.stop()
