"""A worker killed with SIGKILL while detection requests are pending: once a new worker is
up, detection for the job runs within two detection intervals (behavioural bound, plus a
little slack for a loaded 2-core machine), and the lag shows in ``/metrics`` meanwhile.

The kill lands while the worker holds the job's countdown task (kombu keeps a task it
received but has not finished in Redis's ``unacked`` hash; after a SIGKILL it would come back
only after the broker's visibility timeout, an hour). Nothing is ingested after the kill,
so only Vigil itself can bring the request back: beat re-queues detection for jobs whose
oldest pending request is older than two intervals.
"""

from __future__ import annotations

import time

import pytest
from redis import Redis

from tests.reliability.stack import (
    VigilStack,
    log_size,
    metric,
    straggler_batches,
    straggler_incidents,
    wait_for,
    wait_log,
)

INTERVAL_S = 1.5
SLACK_S = 2.0  # task pickup, one detection run and our polling, on 2 busy cores


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_detection_resumes_within_two_intervals_after_worker_kill(
    tmp_path, reliability_redis, reliability_db
):
    stack = VigilStack(
        tmp_path,
        db_url=reliability_db,
        redis_url=reliability_redis,
        VIGIL_DETECT_INTERVAL_S=str(INTERVAL_S),
        VIGIL_SWEEP_INTERVAL_S="1",
    )
    broker = Redis.from_url(reliability_redis)
    try:
        stack.start_worker()
        stack.start_beat()
        stack.start_server()
        wait_log(stack, "worker", " ready.", 60)

        for body in straggler_batches("victim"):
            assert stack.ingest(body).status_code == 200
        wait_for(lambda: broker.hlen("unacked") >= 1, 5, "the worker taking the detect task")
        stack.kill9("worker")

        time.sleep(2.5 * INTERVAL_S)  # longer than any debounce: only a re-queue helps now
        assert not straggler_incidents(stack.base, "victim"), "detected before the kill"
        lag = metric(stack.base, "vigil_detection_lag_seconds")
        assert lag is not None and lag >= 2 * INTERVAL_S, f"lag not visible: {lag}"
        assert metric(stack.base, "vigil_detection_pending_jobs") == 1

        mark = log_size(stack, "worker")
        stack.start_worker()
        wait_log(stack, "worker", " ready.", 60, after=mark)
        up = time.monotonic()
        found = wait_for(
            lambda: straggler_incidents(stack.base, "victim"),
            2 * INTERVAL_S + SLACK_S,
            f"detection after the new worker was up\nworker:\n{stack.tail('worker')}",
        )
        took = time.monotonic() - up
        assert found[0]["ranks"] == [2]
        print(f"detection {took:.2f} s after the new worker was ready (bound {2 * INTERVAL_S} s)")
        wait_for(
            lambda: metric(stack.base, "vigil_detection_pending_jobs") == 0,
            10,
            "no detection request left pending",
        )
    finally:
        broker.close()
        stack.stop()
