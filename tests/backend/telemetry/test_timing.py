"""Compute time has one definition: the detectors' (numpy), ingest's rollups and the
database's (SQL) give the same numbers, a missing collective time counting as 0."""

from __future__ import annotations

import numpy as np
import pytest
from sqlalchemy import select

from backend.jobs.models import Job
from backend.telemetry.models import StepRecord, StepRollup
from backend.telemetry.rollups import add_step_rollups
from backend.telemetry.timing import compute_time_sql
from detectors.timing import compute_time

# (duration_s, comm_s): a usual step, no wait, no wait reported, all wait, a long step.
ROWS = [(0.31, 0.05), (0.4, 0.0), (0.5, None), (0.2, 0.2), (12.75, 3.125)]


def test_python_and_sql_agree(session):
    job = Job(name="timing", world_size=1)
    session.add(job)
    session.flush()
    session.add_all(
        StepRecord(job_id=job.id, rank=0, step=n, ts=float(n), duration_s=d, comm_s=c)
        for n, (d, c) in enumerate(ROWS)
    )
    session.flush()
    in_sql = session.scalars(
        select(compute_time_sql()).where(StepRecord.job_id == job.id).order_by(StepRecord.step)
    ).all()
    durations, comms = zip(*ROWS, strict=True)
    in_python = compute_time(durations, comms)
    assert in_sql == pytest.approx(in_python.tolist(), rel=1e-15, abs=0)
    assert in_python[2] == 0.5  # no wait reported: the step time


def test_ingest_rollups_sum_the_same_compute_time(session):
    job = Job(name="timing", world_size=1)
    session.add(job)
    session.flush()
    steps = [
        {"step": n, "duration_s": d, **({} if c is None else {"comm_s": c})}
        for n, (d, c) in enumerate(ROWS)
    ]
    add_step_rollups(session=session, job_id=job.id, rank=0, steps=steps)
    row = session.scalars(
        select(StepRollup).where(StepRollup.job_id == job.id, StepRollup.level == 0)
    ).one()
    durations, comms = zip(*ROWS, strict=True)
    expected = compute_time(durations, comms)
    assert row.sum_compute == pytest.approx(float(expected.sum()))
    assert row.max_compute == pytest.approx(float(expected.max()))


def test_a_nan_wait_counts_as_zero_and_a_nan_step_stays_missing():
    out = compute_time(np.array([1.0, np.nan]), np.array([np.nan, 0.5]))
    assert out[0] == 1.0 and np.isnan(out[1])
