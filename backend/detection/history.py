"""The job's step time before a detection window: the slowdown detector's longer view.

    window = attach(session=s, job=job, window=window)   # window.history: StepHistory | None

A slowdown opens only once it has lasted ``SlowdownConfig.min_duration_s`` (60 s); with steps
of 0.1 s the window of the last 200 steps holds 20 s, so the detector asks for as many older
steps as make the window and them last ``view_s`` (:func:`detectors.slowdown.history_steps`,
at most ``max_view_steps`` in all). They are read as one aggregate: per step, the mean step,
collective and data-loader time over ``HISTORY_RANKS`` (2) ranks of the window, its first
and last (:class:`detectors.window.StepHistory`), through the ``(job_id, rank, step)``
index: at most ~8,000 rows, however many ranks the job has.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from sqlalchemy import func, select, union_all
from sqlalchemy.orm import Session

from backend.jobs.models import Job
from backend.telemetry.models import StepRecord
from detectors.arrays import sample_rows
from detectors.slowdown import history_steps
from detectors.window import HISTORY_RANKS, StepHistory, StepWindow


def attach(*, session: Session, job: Job, window: StepWindow) -> StepWindow:
    """``window`` with the job's step time over the steps before it, as far back as the
    slowdown detector asks (the same window when it asks for none, or none are stored)."""
    extra = history_steps(window)
    if extra == 0:
        return window
    history = load_history(
        session=session,
        job_id=job.id,
        attempt=job.attempt or 0,
        ranks=[int(r) for r in window.ranks[sample_rows(window.ranks.size, HISTORY_RANKS)]],
        first_step=int(window.steps[0]) - extra,
        before_step=int(window.steps[0]),
    )
    return dataclasses.replace(window, history=history) if history.steps.size else window


def load_history(
    *,
    session: Session,
    job_id: int,
    attempt: int,
    ranks: list[int],
    first_step: int,
    before_step: int,
) -> StepHistory:
    """Steps ``first_step … before_step - 1`` of the job's ``attempt``: per step, the mean
    over ``ranks`` of the step time, and of its collective and data-loader time (a missing
    one counting as 0, as in ``detectors.timing``)."""
    s = StepRecord
    # One index range per rank (``ix_steps_job_rank_step``): with ``rank IN (…)`` SQLite
    # walks ``ix_steps_job_step`` instead, every rank's rows of those steps.
    per_rank = union_all(
        *(
            select(
                s.step.label("step"),
                s.duration_s.label("step_s"),
                func.coalesce(s.comm_s, 0.0).label("comm_s"),
                func.coalesce(s.data_s, 0.0).label("data_s"),
            ).where(
                s.job_id == job_id,
                s.rank == rank,
                s.step >= first_step,
                s.step < before_step,
                s.attempt == attempt,
            )
            for rank in ranks
        )
    ).subquery()
    rows = session.execute(
        select(
            per_rank.c.step,
            func.avg(per_rank.c.step_s),
            func.avg(per_rank.c.comm_s),
            func.avg(per_rank.c.data_s),
        )
        .group_by(per_rank.c.step)
        .order_by(per_rank.c.step)
    ).all()
    data = np.array([tuple(r) for r in rows], dtype=np.float64).reshape(-1, 4)
    return StepHistory(
        steps=data[:, 0].astype(np.int64),
        step_time=data[:, 1],
        comm_time=data[:, 2],
        data_time=data[:, 3],
    )
