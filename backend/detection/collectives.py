"""The collective part of a detection window, and which ranks each process group has.

``load_collectives``: per (step, group, op) of the window, the bytes and the *fastest*
member's time, aggregated by the database. That is all the comm detector reads: a group's
transfer time is its fastest member's (the others also waited for the last to arrive),
``detectors.comm``. A 512-rank job with three collectives per rank and step has 150,000
records in a 200-step window; read one by one (with their member lists) they cost the
worker 2 s a run, aggregated ~15,000 rows and 0.15 s, mostly in PostgreSQL.

``group_members``: group → its ranks, as collectors reported them. A group's members do not
change within a restart attempt, so each (job, attempt, group) is read once per process and
kept (bounded), instead of reading thousands of member lists every run and every sweep.

    window = load_collectives(session=s, job_id=7, window=steps)
    members = group_members(session=s, job=job, names={"dp-3"}, since_step=100)
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Collection

import numpy as np
from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from backend.jobs.models import Job
from backend.telemetry.models import CollectiveRecord
from detectors.window import CollectiveWindow, StepWindow

MAX_JOBS = 256  # membership tables kept per process, one per job attempt
# (job id, when the job was created, attempt) → group → members (None: reported without)
_known: OrderedDict[tuple[int, float, int], dict[str, list[int] | None]] = OrderedDict()
_lock = threading.Lock()  # the embedded server runs detection on threads


def load_collectives(*, session: Session, job_id: int, window: StepWindow) -> CollectiveWindow:
    """Per (step, group, op) over the window's steps: the bytes, the fastest member's time
    and, as ``rank``, the lowest member that reported; with group membership (empty when
    the job reports no collectives: the comm detector then finds nothing)."""
    job = session.get(Job, job_id)
    attempt = (job.attempt if job is not None else 0) or 0
    c = CollectiveRecord
    first = int(window.steps[0])
    per_group = (
        select(c.step, c.group, c.op, func.max(c.bytes), func.min(c.duration_s), func.min(c.rank))
        .where(c.job_id == job_id, c.attempt == attempt, c.step >= first)
        .group_by(c.step, c.group, c.op)
    )
    rows = session.connection().execute(per_group).all()  # Core: no ORM row overhead
    step, group, op, nbytes, duration, rank = zip(*rows, strict=True) if rows else ((),) * 6
    names = set(group)
    members = group_members(session=session, job=job, names=names, since_step=first)
    world = list(range(window.world_size))
    return CollectiveWindow(
        rank=np.array(rank, dtype=np.int64),
        step=np.array(step, dtype=np.int64),
        group=np.array(group, dtype=np.str_),
        op=np.array(op, dtype=np.str_),
        nbytes=np.array(nbytes, dtype=float),
        duration_s=np.array(duration, dtype=float),
        members={g: members.get(g) or world for g in names},
    )


def group_members(
    *, session: Session, job: Job | None, names: Collection[str], since_step: int
) -> dict[str, list[int]]:
    """The members of the groups ``names``, as reported in the job's current attempt
    (looked up, when not known yet, in its records from step ``since_step`` on and in
    those outside any step). A group reported without members (the world group) is left
    out, and so is one with no record there yet: it is looked up again next time."""
    if job is None or not names:
        return {}
    attempt = job.attempt or 0
    created = job.created_at.timestamp() if job.created_at is not None else 0.0
    key = (job.id, created, attempt)
    with _lock:
        known = _known.setdefault(key, {})
        _known.move_to_end(key)
        while len(_known) > MAX_JOBS:
            _known.popitem(last=False)
    missing = sorted(set(names) - set(known))
    if missing:
        c = CollectiveRecord
        where = (
            c.job_id == job.id,
            c.attempt == attempt,
            or_(c.step >= since_step, c.step.is_(None)),
            c.group.in_(missing),
        )
        # One record per group (every record of a group carries its members; the world
        # group's none, which the JSON column may hold as a JSON null).
        first_rows = select(func.min(c.id)).where(*where).group_by(c.group)
        found = session.execute(select(c.group, c.members).where(c.id.in_(first_rows))).all()
        for name, members in found:
            known[name] = list(members) if members else None
    return {g: m for g in names if (m := known.get(g)) is not None}
