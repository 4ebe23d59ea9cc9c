"""Load what the detectors need from the store, as numpy arrays.

A window is the job's last ``width`` steps of its current restart attempt, pivoted to
rank × step arrays with NaN where a rank did not report.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session

from backend.jobs.models import Job, Rank
from backend.telemetry.models import CollectiveRecord, StepRecord

FloatArray = np.ndarray[Any, np.dtype[np.float64]]

STEP_COLUMNS = ("duration_s", "comm_s", "data_s", "loss", "grad_norm", "mem_bytes")


@dataclass
class Window:
    steps: np.ndarray[Any, np.dtype[np.int64]]  # (S,)
    ranks: np.ndarray[Any, np.dtype[np.int64]]  # (R,)
    step_time: FloatArray  # (R, S)
    comm_time: FloatArray
    data_time: FloatArray
    loss: FloatArray
    grad_norm: FloatArray
    mem_bytes: FloatArray

    @property
    def has_comm(self) -> bool:
        return bool(np.isfinite(self.comm_time).any())


def load_window(*, session: Session, job_id: int, width: int = 200) -> Window | None:
    attempt = session.scalar(select(Job.attempt).where(Job.id == job_id)) or 0
    recent = (
        select(StepRecord.step)
        .where(StepRecord.job_id == job_id, StepRecord.attempt == attempt)
        .distinct()
        .order_by(StepRecord.step.desc())
        .limit(width)
        .subquery()
    )
    oldest = session.scalar(select(recent.c.step).order_by(recent.c.step).limit(1))
    if oldest is None:
        return None
    rows = session.execute(
        select(
            StepRecord.rank, StepRecord.step, *(getattr(StepRecord, c) for c in STEP_COLUMNS)
        ).where(
            StepRecord.job_id == job_id,
            StepRecord.attempt == attempt,
            StepRecord.step >= oldest,
        )
    ).all()
    data = np.array([tuple(np.nan if v is None else v for v in r) for r in rows], dtype=float)
    ranks = np.unique(data[:, 0]).astype(np.int64)
    steps = np.unique(data[:, 1]).astype(np.int64)
    ri = np.searchsorted(ranks, data[:, 0].astype(np.int64))
    si = np.searchsorted(steps, data[:, 1].astype(np.int64))
    arrays = {}
    for col, name in enumerate(STEP_COLUMNS, start=2):
        grid = np.full((len(ranks), len(steps)), np.nan)
        grid[ri, si] = data[:, col]
        arrays[name] = grid
    return Window(
        steps=steps,
        ranks=ranks,
        step_time=arrays["duration_s"],
        comm_time=arrays["comm_s"],
        data_time=arrays["data_s"],
        loss=arrays["loss"],
        grad_norm=arrays["grad_norm"],
        mem_bytes=arrays["mem_bytes"],
    )


def recent_step_durations(*, session: Session, job_id: int, limit: int = 400) -> list[float]:
    return list(
        session.scalars(
            select(StepRecord.duration_s)
            .where(StepRecord.job_id == job_id)
            .order_by(StepRecord.id.desc())
            .limit(limit)
        )
    )


def rank_states(*, session: Session, job_id: int) -> list[Rank]:
    return list(session.scalars(select(Rank).where(Rank.job_id == job_id).order_by(Rank.rank)))


def group_members(*, session: Session, job_id: int, limit: int = 5000) -> dict[str, list[int]]:
    """Process-group membership as collectors reported it (the world group has none)."""
    rows = session.execute(
        select(CollectiveRecord.group, CollectiveRecord.members)
        .where(CollectiveRecord.job_id == job_id, CollectiveRecord.members.is_not(None))
        .order_by(CollectiveRecord.id.desc())
        .limit(limit)
    ).all()
    groups: dict[str, list[int]] = {}
    for group, members in rows:
        if members is not None:
            groups.setdefault(group, members)
    return groups
