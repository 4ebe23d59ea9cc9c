"""The straggler detector is told which ranks the job's open straggler incidents name, so a
rank slower by about the threshold is not judged afresh in every window: it stays named
while it stays at the hold level (issue 15, item 1). Data goes in through the ingest API."""

from __future__ import annotations

import numpy as np

from backend.detection import baselines
from backend.detection.runner import detect_job
from backend.incidents.models import Incident
from backend.incidents.service import fingerprint
from backend.jobs.models import Job
from detectors.window import StepWindow
from tests.backend.detection.test_runner import incidents, job_id, post_steps
from tests.backend.detection.test_straggler_baselines import post_compute

RANKS, SLOW = 8, 2


def _slow_rank(rank: int, n: int) -> float:
    if rank != SLOW or n < 100:
        return 1.0
    return 1.25 if n < 150 else 1.08


def test_a_named_rank_stays_named_at_the_hold_level_across_runs(client, session):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(3)
    for start in range(0, 700, 50):  # detection after every flush, as the backend runs it
        post_compute(client, range(start, start + 50), rng, _slow_rank)
        detect_job(session=session, job_id=job_id(session))
        session.commit()
    found = [i for i in incidents(client) if i["kind"] == "straggler"]
    # One incident, still open 550 steps after the rank last crossed the threshold (the
    # window has not held a step over it for 350 steps).
    assert [(i["ranks"], i["status"]) for i in found] == [([SLOW], "open")], found
    assert 100 <= found[0]["first_step"] <= 105
    assert "since step" in found[0]["summary"]


def test_attach_named_hands_over_the_open_straggler_incidents_of_the_current_run(client, session):  # type: ignore[no-untyped-def]
    post_steps(client, ranks=4, steps=range(30))
    job = session.get(Job, job_id(session))
    assert job is not None

    def incident(key: str, status: str, first_step: int, *, run: int = 1) -> None:
        kind, _, rank = key.partition(":")
        session.add(
            Incident(
                job_id=job.id,
                kind=kind,
                fingerprint=fingerprint(job.id, key, run),
                status=status,
                ranks=[int(rank)],
                first_step=first_step,
            )
        )

    incident("straggler:1", "open", 12)
    incident("straggler:2", "resolved", 15)  # over: judged afresh
    incident("hang:3", "open", 20)  # another kind
    incident("straggler:0", "open", 7, run=2)  # of another run than the job's current one
    session.flush()
    window = StepWindow.from_arrays(steps=range(30), ranks=[0, 1, 2, 3], step_time=np.ones((4, 30)))
    named = baselines.attach_named(session=session, job=job, window=window)
    assert named.straggler_since is not None
    assert np.array_equal(named.straggler_since, [np.nan, 12, np.nan, np.nan], equal_nan=True)
    # Rows follow the window's ranks, whatever their order.
    window = StepWindow.from_arrays(steps=range(30), ranks=[1, 3], step_time=np.ones((2, 30)))
    named = baselines.attach_named(session=session, job=job, window=window)
    assert np.array_equal(named.straggler_since, [12, np.nan], equal_nan=True)
