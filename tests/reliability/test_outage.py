"""The collector across a server outage (issue 13, item 9).

A real ``vigil server`` is killed (SIGKILL) while a real collector process streams steps, and
restarted on the same port and database several seconds later. Delivery resumes within a
few seconds of the server's return (a behavioural bound: the collector probes with its
heartbeats instead of sleeping through a long backoff); the buffer, made small for the test,
overflows during the outage and gives up the *oldest* steps, so the newest reach the server;
what the server had stored is still there, and nothing arrives twice.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest

from backend.launch import kill_tree
from tests.conftest import ADMIN, BACKENDS, backend_url
from tests.reliability.collector_job import finish_job, start_job
from tests.servers import VIGIL, free_port, vigil_env

JOB = "outage"
BUFFER = 200  # events; the job makes ~40 steps/s, so the buffer holds ~5 s of them
OUTAGE_S = 8.0
RESUME_WITHIN_S = 8.0


@pytest.fixture(params=BACKENDS)
def server_db(request, tmp_path_factory):  # type: ignore[no-untyped-def]
    return backend_url(request.param, tmp_path_factory, suffix="outage")


@contextmanager
def server(database_url: str, port: int) -> Iterator[subprocess.Popen[str]]:
    """``vigil server`` on ``port``, answering /healthz when this yields; SIGKILLed after."""
    proc = subprocess.Popen(
        [*VIGIL, "server", "--port", str(port), "--migrate"],
        env=vigil_env(database_url),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, "vigil server exited"
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "vigil server did not start within 60 s"
            time.sleep(0.05)
        yield proc
    finally:
        kill_tree(proc.pid)
        proc.wait()


def stored_steps(base: str) -> list[dict]:
    reply = httpx.get(
        f"{base}/api/v1/jobs/{JOB}/steps", params={"limit": 10_000}, headers=ADMIN, timeout=10
    )
    return reply.json()["items"] if reply.status_code == 200 else []


def wait_for(ready, timeout: float, what: str):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not (value := ready()):
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(0.1)
    return value


@pytest.mark.timeout(150)
def test_delivery_resumes_soon_after_an_outage_and_keeps_the_newest(server_db, tmp_path):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    stop = tmp_path / "stop"
    with server(server_db, port):
        proc = start_job(
            base,
            job=JOB,
            workdir=tmp_path,
            JOB_STEP_S=0.02,
            JOB_STOP_FILE=str(stop),
            VIGIL_MAX_QUEUE=BUFFER,
            VIGIL_FLUSH_S=0.2,
        )
        try:
            wait_for(lambda: len(stored_steps(base)) >= 40, 30, "steps before the outage")
            # Stored (acknowledged) before the SIGKILL: all must still be there after it.
            acknowledged = {s["step"] for s in stored_steps(base)}
        except BaseException:
            proc.kill()
            raise
    killed_at = time.time()
    try:
        time.sleep(OUTAGE_S)
        with server(server_db, port):
            back_at = time.time()
            steps = wait_for(
                lambda: [s for s in stored_steps(base) if s["ts"] > killed_at],
                RESUME_WITHIN_S,
                "delivery resumed after the server came back",
            )
            resumed_in = time.time() - back_at
            time.sleep(2)  # a little more training with the server up
            stop.touch()
            stats = finish_job(proc)
            steps = stored_steps(base)
    finally:
        if proc.poll() is None:
            proc.kill()

    numbers = [s["step"] for s in steps]
    assert len(numbers) == len(set(numbers)), "a step was stored twice"
    assert acknowledged <= set(numbers), "a step the server had stored was lost"
    assert stats["flushed"] and stats["steps"] == max(numbers) + 1, stats
    # The buffer overflowed: the lost steps are one run of the oldest buffered ones, and
    # every step of the last ~2 s before the server came back arrived.
    missing = sorted(set(range(stats["steps"])) - set(numbers))
    assert missing, f"the outage did not overflow the buffer: {stats}"
    # One exception: a batch whose request went out as the server came back is stored while
    # the buffer behind it, still full, drops what came after it; it shows as one island of
    # consecutive steps inside the gap (seen once in CI: 365–367 amid 43–400).
    island = sorted(set(range(missing[0], missing[-1] + 1)) - set(missing))
    assert island == list(range(island[0], island[-1] + 1)) if island else True, island
    # (More may have been dropped than is missing: the events of a batch the server stored
    # just before the SIGKILL, whose reply was lost, can be trimmed from its retry.)
    assert set(stats["dropped"]) == {"buffer_full"}, stats
    assert stats["dropped"]["buffer_full"] >= len(missing), stats
    # Every step after the gap arrived, and the gap ends more than 2 s before the return.
    first_kept_ts = {s["step"]: s["ts"] for s in steps}[missing[-1] + 1]
    assert first_kept_ts < back_at - 2.0, (first_kept_ts - killed_at, back_at - killed_at)
    print(f"delivery resumed {resumed_in:.1f} s after the server answered /healthz")
