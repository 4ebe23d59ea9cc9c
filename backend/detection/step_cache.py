"""A job's recent step rows, kept between detection runs so that a run reads only new rows.

``backend.detection.window.load_steps`` needs every rank's row of the job's last ``width``
steps: 51,200 rows at 256 ranks, read and pivoted about every 2 s, growing with the ranks.
Step rows are only ever inserted, so a step with a row from every rank of the job's world
(*complete*) cannot change again: it is kept here and not read again. A run reads the rows
from the first step that still can change, and replaces those steps whole:

- the oldest incomplete step (the newest steps wait for late ranks; a crashed rank's steps
  stay incomplete, and are read every run while the window holds them, as before);
- the step after a gap between two kept steps (a step none of whose rows is in yet);
- else the step after the newest kept one.

Until the job has ``width`` steps every run reads them all: a late step below the oldest
one would still belong in the window. The result is the same rows a full read returns.

Kept per process (each Celery worker process, or the embedded server), for the
``MAX_JOBS`` jobs read most recently and at most ``MAX_ROWS`` rows in all; each job's rows
are stamped with its creation time (ids are reused: a deleted job's, the tests'), its
attempt and the width, so a restart, or another job under the same id, starts afresh.

    rows = step_rows(session=session, job_id=7, attempt=0, world=8, created=created, width=200)
    rows[:, COLUMNS.index("loss")]   # one row per (rank, step), NaN where not sent
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import datetime
from typing import NamedTuple

import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session

from backend.telemetry.models import StepRecord

STEP_COLUMNS = ("duration_s", "comm_s", "data_s", "loss", "grad_norm", "mem_bytes")
# The columns of a rows array: loss_sent and grad_sent are 1.0 where the rank sent a
# value (a NaN loss is data; a missing one is not).
COLUMNS = ("rank", "step", *STEP_COLUMNS, "loss_sent", "grad_sent")

MAX_JOBS = 8
MAX_ROWS = 3_000_000  # 80 bytes a row: at most about 240 MB per process


class _Step(NamedTuple):
    rows: np.ndarray  # every row read of the step
    ranks: int  # how many ranks it has a row from
    top: int  # its highest rank


@dataclass
class _Job:
    """What is kept of one job: its last steps, ascending."""

    stamp: tuple[float, int, int]  # created_at, attempt, width
    steps: dict[int, _Step] = field(default_factory=dict)

    @property
    def rows(self) -> int:
        return sum(len(s.rows) for s in self.steps.values())


_kept: OrderedDict[int, _Job] = OrderedDict()
_lock = threading.Lock()


def step_rows(
    *,
    session: Session,
    job_id: int,
    attempt: int,
    world: int,
    created: datetime | None,
    width: int,
    cached: bool = True,
) -> np.ndarray:
    """``(N, len(COLUMNS))`` rows of the job's last ``width`` steps of ``attempt``, every
    rank's row of each (``world``: the job's world size). Reads only the rows that may have
    changed since this process last read the job; ``cached=False`` reads them all."""
    if not cached or created is None:
        return read_rows(session=session, job_id=job_id, attempt=attempt, width=width)
    stamp = (created.timestamp(), attempt, width)
    with _lock:  # taken out while in use: a concurrent run for the job reads afresh
        kept = _kept.pop(job_id, None)
    if kept is None or kept.stamp != stamp:
        kept = _Job(stamp)
    since = first_open_step(kept, world=world, width=width)
    fresh = read_rows(session=session, job_id=job_id, attempt=attempt, width=width, since=since)
    _merge(kept, fresh, since=since, width=width)
    rows = np.concatenate([fresh[:0], *(s.rows for s in kept.steps.values())])
    _keep(job_id, kept)
    return rows


def first_open_step(kept: _Job, *, world: int, width: int) -> int | None:
    """The first step whose rows may still change (the module's docstring says which), or
    None when everything must be read."""
    if not kept.steps or len(kept.steps) < width:
        return None
    world = max(world, max(s.top for s in kept.steps.values()) + 1)  # as the window's
    previous = None
    for step, kept_step in kept.steps.items():
        if previous is not None and step != previous + 1:
            return previous + 1
        if kept_step.ranks < world:
            return step
        previous = step
    return step + 1


def read_rows(
    *, session: Session, job_id: int, attempt: int, width: int, since: int | None = None
) -> np.ndarray:
    """The rows of the steps from ``since`` on (None: of the last ``width`` steps)."""
    if since is None:
        recent = (
            select(StepRecord.step)
            .where(StepRecord.job_id == job_id, StepRecord.attempt == attempt)
            .distinct()
            .order_by(StepRecord.step.desc())
            .limit(width)
            .subquery()
        )
        since = session.scalar(select(recent.c.step).order_by(recent.c.step).limit(1))
        if since is None:
            return np.empty((0, len(COLUMNS)))
    query = select(
        StepRecord.rank, StepRecord.step, *(getattr(StepRecord, c) for c in STEP_COLUMNS)
    ).where(
        StepRecord.job_id == job_id,
        StepRecord.attempt == attempt,
        StepRecord.step >= since,
    )
    rows = session.connection().execute(query).all()  # Core: no ORM row overhead
    if not rows:
        return np.empty((0, len(COLUMNS)))
    # None (not sent) becomes NaN; the flags keep which values were sent.
    return np.array([(*r, r.loss is not None, r.grad_norm is not None) for r in rows], dtype=float)


def _merge(kept: _Job, fresh: np.ndarray, *, since: int | None, width: int) -> None:
    """Replace the steps from ``since`` on (all, when None) with the ``fresh`` rows read of
    them, and keep the last ``width`` steps."""
    steps = {s: r for s, r in kept.steps.items() if since is not None and s < since}
    fresh = fresh[np.argsort(fresh[:, 1], kind="stable")]
    ids, starts = np.unique(fresh[:, 1], return_index=True)
    for step, rows in zip(ids, np.split(fresh, starts[1:]) if ids.size else [], strict=True):
        ranks = np.unique(rows[:, 0])
        # A copy, not a view: the rest of ``fresh`` can go.
        steps[int(step)] = _Step(rows.copy(), ranks.size, int(ranks[-1]))
    kept.steps = dict(sorted(steps.items(), key=lambda item: item[0])[-width:])


def _keep(job_id: int, kept: _Job) -> None:
    """Put the job back as the most recent; drop the least recent beyond the bounds."""
    with _lock:
        _kept[job_id] = kept
        total = sum(k.rows for k in _kept.values())
        while _kept and (len(_kept) > MAX_JOBS or total > MAX_ROWS):
            _, dropped = _kept.popitem(last=False)
            total -= dropped.rows
