"""A job-wide slowdown of a job with short steps, through ingest and a detection run at the
default window (issue 17): the last 200 steps of 0.1 s hold 20 s, less than the 60 s a
slowdown must last, so the window carries the job's step time before them
(``backend.detection.history``) and the slowdown opens."""

from __future__ import annotations

import numpy as np
import pytest
from sqlalchemy import select

from backend.detection import history
from backend.detection.runner import detect_job
from backend.detection.window import load_steps
from backend.jobs.models import Job
from detectors.slowdown import history_steps
from detectors.window import StepHistory
from tests.conftest import ADMIN, INGEST
from tests.factories import batch

JOB = "tiny-gpt-short-steps"
T0 = 1_700_000_000.0
RANKS = 3
CLEAN, SLOW = 1500, 600  # 150 s of 0.1-s steps, then 90 s of 0.15-s ones


def comm_times(times: np.ndarray) -> np.ndarray:
    """Each rank waits a different share of the step in collectives."""
    return times * (0.2 + 0.05 * np.arange(RANKS) ** 2)[:, None]  # 20%, 25%, 40%


def step_times() -> np.ndarray:
    """``(RANKS, CLEAN + SLOW)``: every rank shares the step time, as in synchronous training."""
    rng = np.random.default_rng(0)
    t = 0.1 * rng.lognormal(0, 0.05, CLEAN + SLOW)
    t[CLEAN:] *= 1.5
    return np.broadcast_to(t, (RANKS, t.size))


def post(client, times: np.ndarray) -> None:  # type: ignore[no-untyped-def]
    ends = T0 + np.cumsum(times[0])
    comm = comm_times(times)
    for rank in range(RANKS):
        events = [
            {
                "type": "step",
                "step": n,
                "ts": float(ends[n]),
                "duration_s": float(times[rank, n]),
                "comm_s": float(comm[rank, n]),
                "data_s": 0.002,
            }
            for n in range(times.shape[1])
        ]
        events.append({"type": "heartbeat", "ts": float(ends[-1]), "step": times.shape[1]})
        reply = client.post(
            "/api/v1/ingest",
            json=batch(events, job=JOB, rank=rank, world_size=RANKS),
            headers=INGEST,
        )
        assert reply.status_code == 200, reply.text


def test_short_steps_slowdown_opens_at_the_default_window(client, session) -> None:  # type: ignore[no-untyped-def]
    post(client, step_times())
    job_id = session.scalar(select(Job.id).where(Job.name == JOB))

    detect_job(session=session, job_id=job_id)  # width=200, the default
    session.commit()

    found = client.get(f"/api/v1/jobs/{JOB}/incidents", headers=ADMIN).json()
    assert [(i["kind"], i["ranks"], i["status"]) for i in found] == [("slowdown", [], "open")]
    (incident,) = found
    assert abs(incident["first_step"] - CLEAN) <= 5
    assert incident["evidence"]["rise_pct"] == pytest.approx(50, abs=5)
    assert incident["evidence"]["slow_for_s"] == pytest.approx(90, rel=0.05)


def test_the_window_carries_the_job_step_time_before_it(client, session) -> None:  # type: ignore[no-untyped-def]
    times = step_times()
    post(client, times)
    job = session.scalar(select(Job).where(Job.name == JOB))
    window = load_steps(session=session, job_id=job.id)

    window = history.attach(session=session, job=job, window=window)

    first = CLEAN + SLOW - 200
    assert window.steps.tolist() == list(range(first, CLEAN + SLOW))
    h = window.history
    assert h is not None
    # 180 s at the window's ~0.15-s steps: ~1,200 steps, ~1,000 of them before the window.
    assert 950 <= history_steps(window) <= 1050
    assert h.steps.tolist() == list(range(first - history_steps(window), first))
    lo, hi = int(h.steps[0]), first
    twin = StepHistory.from_arrays(  # the same mean over the same ranks, over arrays
        steps=range(lo, hi),
        step_time=times[:, lo:hi],
        comm_time=comm_times(times)[:, lo:hi],
        data_time=np.full((RANKS, hi - lo), 0.002),
    )
    np.testing.assert_allclose(h.step_time, twin.step_time, rtol=1e-9)
    np.testing.assert_allclose(h.comm_time, twin.comm_time, rtol=1e-9)
    np.testing.assert_allclose(h.comm_time, 0.3 * times[0, lo:hi])  # ranks 0 and 2: first, last
    np.testing.assert_allclose(h.data_time, twin.data_time, rtol=1e-9)


def test_a_window_of_long_steps_loads_no_history(client, session) -> None:  # type: ignore[no-untyped-def]
    """200 steps of 1 s last over the 180 s of the view: nothing more is read."""
    post(client, np.ones((RANKS, 250)))
    job = session.scalar(select(Job).where(Job.name == JOB))
    window = load_steps(session=session, job_id=job.id)

    assert history.attach(session=session, job=job, window=window) is window
