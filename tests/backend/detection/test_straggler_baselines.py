"""Each rank's normal speed is learned once and kept across detection runs, so a group of
ranks that slows down and stays slow stays named after the 200-step window has slid past
its onset (issue 15, item 1). Data goes in through the ingest API, as collectors send it."""

from __future__ import annotations

import os
from collections.abc import Callable
from datetime import UTC, datetime

import numpy as np
import pytest
from redis import Redis

from backend.detection import baselines
from backend.detection.runner import detect_job
from backend.jobs.models import Job
from detectors.window import StepWindow
from tests.backend.detection.test_runner import T0, incidents, job_id
from tests.conftest import INGEST
from tests.factories import batch

RANKS, SLOW, ONSET, FACTOR = 8, (2, 5, 6), 100, 1.25


def _slow_group(rank: int, n: int) -> float:
    return FACTOR if rank in SLOW and n >= ONSET else 1.0


def post_compute(  # type: ignore[no-untyped-def]
    client, steps: range, rng: np.random.Generator, factor: Callable[[int, int], float]
) -> None:
    """One batch per rank of 0.5-s steps ``steps``: compute ~0.3 s (1% noise) times
    ``factor(rank, step)``, the rest collective wait, then a heartbeat."""
    for rank in range(RANKS):
        events = []
        for n in steps:
            compute = 0.3 * (1 + rng.normal(0, 0.01)) * factor(rank, n)
            events.append(
                {
                    "type": "step",
                    "step": n,
                    "ts": T0 + n,
                    "duration_s": 0.5,
                    "comm_s": 0.5 - compute,
                    "loss": 2.0,
                }
            )
        events.append({"type": "heartbeat", "ts": T0 + steps[-1] + 1, "step": steps[-1] + 1})
        reply = client.post(
            "/api/v1/ingest", json=batch(events, rank=rank, world_size=RANKS), headers=INGEST
        )
        assert reply.status_code == 200, reply.text


def test_a_slow_group_stays_named_after_the_window_slides_past_its_onset(client, session):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(1)
    for start in range(0, 700, 50):  # detection after every flush, as the backend runs it
        post_compute(client, range(start, start + 50), rng, _slow_group)
        detect_job(session=session, job_id=job_id(session))
        session.commit()
    found = [i for i in incidents(client) if i["kind"] == "straggler"]
    named = {tuple(i["ranks"]): i for i in found}
    assert sorted(r for (r,) in named) == list(SLOW), [(i["ranks"], i["status"]) for i in found]
    for incident in named.values():
        # 500 steps after the onset the window (200 steps) is far past it: still open.
        assert incident["status"] == "open", incident["summary"]
        assert ONSET <= incident["first_step"] <= ONSET + 10


def _window(ratios: list[float]) -> StepWindow:
    rng = np.random.default_rng(0)
    # learn_steps (100) steps: a window has to hold that many before its normals are kept
    times = np.array(ratios)[:, None] * rng.normal(1.0, 0.005, (len(ratios), 120))
    return StepWindow.from_arrays(steps=range(120), ranks=range(len(ratios)), step_time=times)


def test_kept_baselines_are_reused_not_relearned() -> None:
    job = Job(id=9001, name="kept", attempt=0, created_at=datetime.now(UTC))
    first = baselines.attach(job=job, window=_window([1.1, 1.0, 1.0, 1.0]))
    assert first.straggler_baseline is not None
    assert first.straggler_baseline[0] == pytest.approx(1.1, abs=0.02)
    # Later every rank is equally fast: rank 0 keeps the normal it was learned with.
    later = baselines.attach(job=job, window=_window([1.0, 1.0, 1.0, 1.0]))
    assert later.straggler_baseline is not None
    assert later.straggler_baseline[0] == pytest.approx(1.1, abs=0.02)
    # A new attempt (a restart) learns afresh.
    job.attempt = 1
    fresh = baselines.attach(job=job, window=_window([1.0, 1.0, 1.0, 1.0]))
    assert fresh.straggler_baseline is not None
    assert fresh.straggler_baseline[0] == pytest.approx(1.0, abs=0.02)


def test_baselines_are_kept_in_redis_for_every_worker() -> None:
    url = os.environ.get("VIGIL_TEST_REDIS_URL")
    if not url:
        pytest.skip("needs VIGIL_TEST_REDIS_URL (a Redis to use)")
    redis = Redis.from_url(url)
    job = Job(id=9002, name="shared", attempt=0, created_at=datetime.now(UTC))
    try:
        baselines.attach(job=job, window=_window([1.1, 1.0, 1.0, 1.0]), redis=redis)
        key = baselines._key(job)
        assert float(redis.hget(key, "0")) == pytest.approx(1.1, abs=0.02)  # type: ignore[arg-type]
        assert 0 < redis.ttl(key) <= baselines.TTL_S
        other_worker = baselines.attach(job=job, window=_window([1.0] * 4), redis=redis)
        assert other_worker.straggler_baseline is not None
        assert other_worker.straggler_baseline[0] == pytest.approx(1.1, abs=0.02)
    finally:
        redis.delete(baselines._key(job))
        redis.close()
