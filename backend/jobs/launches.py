"""Which run and attempt of a job a batch belongs to, and how the job follows its launches.

A job name is launched again and again; each launch is a *run* (``backend.jobs.runs``),
and torchrun counts restarts inside it (``attempt``, from ``TORCHELASTIC_RESTART_COUNT``).
The job row points at its *current* run and holds that run's ``kind`` and current
attempt, numbered job-wide (the run's ``first_attempt`` + the batch's ``attempt``):
detection judges only that attempt's steps (``backend.detection.window``) and actions are
made for it (``backend.actions``). A batch names its run by the header's optional ``run``
key; a batch without one belongs to the current run.

A batch of the current run (the same key, or none) moves the job when

- it is a restart: the same kind, an attempt a little above the current one
  (at most ``MAX_ATTEMPT_STEP`` up: attempts that died before they reported are skipped);
- or the current launch is over: every rank of the current attempt said goodbye
  (``exiting``) or has been silent for ``RELAUNCH_QUIET_S``. Then any batch takes over,
  as a **new run** under the same key (or a made-up one): a relaunch at attempt 0, or a
  job name reused for the other kind.

A batch with another key is another launch: the first one of a key starts a new run, which
takes over at once when the current launch is over, and otherwise waits, its telemetry
stored apart under its own attempts, until it is (its next batch after that takes over).
The run it replaces is ended then (``backend.jobs.runs.judge``).

Anything else is not the current launch: a lagging rank of an earlier attempt, or an
attempt far above the current one. Its telemetry is stored (under its attempt), but it
neither moves the job, nor updates the rank's live state, nor receives or closes actions;
a batch of the other kind is refused with a 409 that says how long until the name is
free. So no single payload can blind detection of a job that keeps reporting, and one
sent while a job is quiet loses its hold ``RELAUNCH_QUIET_S`` after it stops.

The common batch (the current run's current attempt) costs one read of the job row;
everything else is decided again with the job row locked, so concurrent first batches of a
new launch start one run, not several. Many batches at once (``/ingest/multi``) read their
jobs' rows once (:func:`read_jobs`) and take :func:`current_launch` for each batch that is
of the current launch and changes nothing; the others go through :func:`follow_launch`.

    launch = follow_launch(session=s, name="llama", kind="training", world_size=8,
                           attempt=1, run="3f2c…")
    launch.job_id, launch.current   # (7, True): a restart, the job is at attempt 1 now
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from backend.db import insert_for, utcnow
from backend.errors import Conflict
from backend.jobs.models import Job, Rank, Run
from backend.jobs.runs import (
    RELAUNCH_QUIET_S,
    Verdict,
    attempt_ranks,
    end_run,
    judge,
    latest_run,
    new_key,
    start_run,
)

__all__ = [
    "MAX_ATTEMPT_STEP",
    "RELAUNCH_QUIET_S",
    "JobKindConflict",
    "JobRow",
    "Launch",
    "current_launch",
    "follow_launch",
    "read_jobs",
]

MAX_ATTEMPT_STEP = 5


class JobKindConflict(Conflict):
    """The batch names a job of the other kind that is still reporting."""


@dataclass(frozen=True)
class Launch:
    job_id: int
    attempt: int  # the job's current attempt (job-wide), after this batch
    current: bool  # whether the batch belongs to it
    stored: int  # the job-wide attempt the batch's telemetry is stored under
    run_id: int | None = None  # the run the batch belongs to


@dataclass(frozen=True)
class JobRow:
    """What deciding a batch's launch reads of its job (and the job's current run)."""

    id: int
    kind: str
    world_size: int
    attempt: int
    run_id: int | None
    run_key: str | None
    first_attempt: int


_COLUMNS = (Job.id, Job.kind, Job.world_size, Job.attempt, Job.run_id, Run.key, Run.first_attempt)


def _read(session: Session, name: str, *, lock: bool = False) -> JobRow | None:
    query: Any = select(*_COLUMNS).outerjoin(Run, Run.id == Job.run_id).where(Job.name == name)
    if lock:
        query = query.with_for_update(of=Job)
    row = session.execute(query).first()
    return None if row is None else _row(*row)


def _row(*columns: Any) -> JobRow:
    """A ``JobRow`` from ``_COLUMNS``' values (a job without a run yet: first attempt 0)."""
    job_id, kind, world_size, attempt, run_id, run_key, first_attempt = columns
    return JobRow(job_id, kind, world_size, attempt, run_id, run_key, first_attempt or 0)


def read_jobs(*, session: Session, names: Iterable[str]) -> dict[str, JobRow]:
    """The rows of the jobs named (those that exist), in one query."""
    query = (
        select(Job.name, *_COLUMNS)
        .outerjoin(Run, Run.id == Job.run_id)
        .where(Job.name.in_(sorted(set(names))))
    )
    return {name: _row(*columns) for name, *columns in session.execute(query)}


def current_launch(
    row: JobRow, *, kind: str, world_size: int, attempt: int, run: str | None
) -> Launch | None:
    """The launch of a batch of the job's current run and attempt, as ``row`` has them,
    that changes nothing of the job (its world size included): what :func:`follow_launch`
    would decide from its one read. None when it must decide (and perhaps write)."""
    launch = _current(row, kind=kind, attempt=attempt, run=run)
    return launch if launch is not None and world_size == row.world_size else None


def _current(row: JobRow, *, kind: str, attempt: int, run: str | None) -> Launch | None:
    if row.run_id is None or run not in (None, row.run_key):
        return None
    stored = row.first_attempt + attempt
    if kind != row.kind or stored != row.attempt:
        return None
    return Launch(row.id, row.attempt, True, stored, row.run_id)


def follow_launch(
    *,
    session: Session,
    name: str,
    kind: str,
    world_size: int,
    attempt: int,
    run: str | None = None,
    now: datetime | None = None,
) -> Launch:
    """Find or create the job and decide which run and attempt the batch belongs to,
    moving the job to the batch's launch when it starts one. The job row is written only
    when something about it changes, so concurrent batches from many ranks do not queue on
    one row lock."""
    row = _read(session, name)
    if row is None:
        session.execute(
            insert_for(session, Job)
            .values(name=name, kind=kind, world_size=world_size, attempt=0, created_at=utcnow())
            .on_conflict_do_nothing(index_elements=["name"])
        )
        row = _read(session, name)
        assert row is not None
    launch = _current(row, kind=kind, attempt=attempt, run=run)
    if launch is not None:
        if world_size != row.world_size:  # elastic jobs, evicted ranks
            session.execute(update(Job).where(Job.id == row.id).values(world_size=world_size))
        return launch
    locked = _read(session, name, lock=True)
    assert locked is not None
    return _Follow(session, locked, kind, world_size, attempt, run, now or utcnow()).decide()


@dataclass
class _Follow:
    """The rare decisions, with the job row locked."""

    session: Session
    row: JobRow
    kind: str
    world_size: int
    attempt: int
    key: str | None
    now: datetime

    def decide(self) -> Launch:
        row = self.row
        if row.run_id is None:  # the job's first run (or a job an import made)
            return self._take_over(self._start(), None)
        if self.key in (None, row.run_key):
            return self._within_current()
        other = latest_run(session=self.session, job_id=row.id, key=self.key or "")
        if self._live():
            if self.kind != row.kind:
                raise self._kind_conflict()
            if other is None:  # a new launch: it waits, kept apart, until this one is over
                other = self._start()
            # (or late data of a run that ended, kept under its own attempts)
            return Launch(row.id, row.attempt, False, other.first_attempt + self.attempt, other.id)
        if other is None or other.state != "running":
            other = self._start()
        return self._take_over(other, row.run_id)

    def _within_current(self) -> Launch:
        row = self.row
        stored = row.first_attempt + self.attempt
        if self.kind == row.kind and stored == row.attempt:  # another batch moved it already
            return Launch(row.id, row.attempt, True, stored, row.run_id)
        restart = self.kind == row.kind and row.attempt < stored <= row.attempt + MAX_ATTEMPT_STEP
        if restart:
            self._move(row.run_id, stored)
            return Launch(row.id, stored, True, stored, row.run_id)
        if self._live():
            if self.kind != row.kind:
                raise self._kind_conflict()
            return Launch(row.id, row.attempt, False, stored, row.run_id)
        # The current launch is over: this batch starts the next run, under the same key.
        return self._take_over(self._start(), row.run_id)

    def _start(self) -> Run:
        key = self.key or new_key(self.now)
        return start_run(
            session=self.session, job_id=self.row.id, key=key, kind=self.kind, now=self.now
        )

    def _take_over(self, run: Run, previous: int | None) -> Launch:
        """Make ``run`` the job's current run, ending the one it replaces."""
        if previous is not None:
            old = self.session.get(Run, previous)
            if old is not None and old.state == "running":
                ranks = attempt_ranks(
                    session=self.session, job_id=self.row.id, attempt=self.row.attempt
                )
                verdict = judge(ranks, now=self.now, final=True)
                reason = f"{verdict.reason}; run #{run.number} took over"
                end_run(run=old, verdict=Verdict(verdict.state, reason), now=self.now)
        stored = run.first_attempt + self.attempt
        self._move(run.id, stored)
        return Launch(self.row.id, stored, True, stored, run.id)

    def _move(self, run_id: int | None, attempt: int) -> None:
        self.session.execute(
            update(Job)
            .where(Job.id == self.row.id)
            .values(kind=self.kind, attempt=attempt, world_size=self.world_size, run_id=run_id)
        )

    def _live(self) -> bool:
        return launch_is_live(
            session=self.session, job_id=self.row.id, attempt=self.row.attempt, now=self.now
        )

    def _kind_conflict(self) -> JobKindConflict:
        name = self.session.scalar(select(Job.name).where(Job.id == self.row.id))
        return JobKindConflict(
            f"job {name!r} is a {self.row.kind} job that is still reporting; {self.kind} "
            f"batches under its name are refused until it has been silent for "
            f"{RELAUNCH_QUIET_S:.0f} s (give this {self.kind} job another name)"
        )


def launch_is_live(*, session: Session, job_id: int, attempt: int, now: datetime) -> bool:
    """Whether a rank of the job's ``attempt`` has reported within ``RELAUNCH_QUIET_S``
    and not said goodbye. Asked only for a batch of another launch (rare)."""
    since = now - timedelta(seconds=RELAUNCH_QUIET_S)
    query = select(Rank.id).where(
        Rank.job_id == job_id,
        Rank.attempt == attempt,
        Rank.exited.is_(False),
        Rank.last_seen_at >= since,
    )
    return session.scalar(query.limit(1)) is not None
