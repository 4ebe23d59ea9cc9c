"""One bad string must not black out a rank (issue 13, item 1).

A real ``vigil server`` (SQLite and PostgreSQL) and a real collector process that records
``vigil.event("checkpoint_saved\\x00")`` among its steps. Whatever the server answers to
that event (a 500 when PostgreSQL refuses the NUL byte, a 422 naming the field, or a 200
where the database can hold it), every other step arrives once, the rank never goes silent
(no false ``crash`` or ``hang``), and the collector reports exactly what it set aside.
"""

from __future__ import annotations

import time

import httpx
import pytest

from tests.conftest import ADMIN, BACKENDS, INGEST, backend_url
from tests.factories import batch
from tests.reliability.collector_job import finish_job, start_job
from tests.servers import live_server

JOB = "poison-batch"
STEPS = 300
POISON_AT = 20
FAST_DETECTION = {"VIGIL_DETECT_INTERVAL_S": "0.5", "VIGIL_SWEEP_INTERVAL_S": "1"}


@pytest.fixture(params=BACKENDS)
def server_db(request, tmp_path_factory):  # type: ignore[no-untyped-def]
    return backend_url(request.param, tmp_path_factory, suffix="poison")


def server_refuses_nul(base: str) -> int:
    """The status the server answers to a NUL byte in an event name (another job)."""
    body = batch(
        [{"type": "event", "name": "probe\x00", "ts": time.time(), "attrs": {}}], job="nul-probe"
    )
    return httpx.post(f"{base}/api/v1/ingest", json=body, headers=INGEST, timeout=10).status_code


@pytest.mark.timeout(120)
def test_a_poisoned_event_does_not_black_out_the_rank(server_db, tmp_path):
    with live_server(server_db, **FAST_DETECTION) as base:
        answer = server_refuses_nul(base)
        if server_db.startswith("postgresql"):
            assert answer != 200, "PostgreSQL cannot store a NUL byte in text"
        # ~8 s of steps after the poison: long enough for a silent rank to be called crashed.
        proc = start_job(
            base,
            job=JOB,
            workdir=tmp_path,
            JOB_STEPS=STEPS,
            JOB_STEP_S=0.025,
            JOB_POISON_AT=POISON_AT,
        )
        stats = finish_job(proc)
        time.sleep(2.5)  # a sweep or two after the job's last heartbeat

        assert stats["flushed"], stats
        steps = httpx.get(
            f"{base}/api/v1/jobs/{JOB}/steps", params={"limit": 10_000}, headers=ADMIN
        ).json()["items"]
        assert sorted(s["step"] for s in steps) == list(range(STEPS))  # all, once
        incidents = httpx.get(f"{base}/api/v1/jobs/{JOB}/incidents", headers=ADMIN).json()
        assert [i for i in incidents if i["kind"] in ("crash", "hang")] == []

        if answer == 200:  # the database holds the NUL byte: nothing to set aside
            assert stats["set_aside_batches"] == 0 and stats["dropped"] == {}
            return
        reason = "rejected" if 400 <= answer < 500 else "failed"
        assert stats["set_aside_batches"] == 1, stats
        assert stats["dropped"] == {reason: 1}, stats  # the poisoned event alone
        assert str(answer) in stats["last_error"]
        ranks = httpx.get(f"{base}/api/v1/jobs/{JOB}/ranks", headers=ADMIN).json()
        assert ranks[0]["drops"] == {reason: 1, "batches_set_aside": 1}
        assert ranks[0]["exited"] is True  # the goodbye arrived too
