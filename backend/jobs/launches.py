"""Which launch of a job a batch belongs to, and how the job follows its launches.

A job name is launched again and again; torchrun counts restarts inside a launch
(``attempt``, from ``TORCHELASTIC_RESTART_COUNT``) and starts over at 0 in the next one.
The job row holds the *current* launch's ``kind`` and ``attempt``: detection judges only
that attempt's steps (``backend.detection.window``) and actions are made for it
(``backend.actions``). A batch moves the job to its own (kind, attempt) when

- it is a restart: the same kind, an attempt a little above the current one
  (at most ``MAX_ATTEMPT_STEP`` up: attempts that died before they reported are skipped);
- or the current launch is over: every rank of the current attempt said goodbye
  (``exiting``) or has been silent for ``RELAUNCH_QUIET_S``. Then any batch takes over:
  a relaunch at attempt 0, or a job name reused for the other kind.

Anything else is not the current launch: a lagging rank of an earlier attempt, or an
attempt far above the current one. Its telemetry is stored (under its attempt), but it
neither moves the job, nor updates the rank's live state, nor receives or closes actions;
a batch of the other kind is refused with a 409 that says how long until the name is
free. So no single payload can blind detection of a job that keeps reporting, and one
sent while a job is quiet loses its hold ``RELAUNCH_QUIET_S`` after it stops.

    launch = follow_launch(session=s, name="llama", kind="training", world_size=8,
                           attempt=1)
    launch.job_id, launch.current   # (7, True): a restart, the job is at attempt 1 now
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from backend.db import insert_for, utcnow
from backend.errors import Conflict
from backend.jobs.models import Job, Rank

RELAUNCH_QUIET_S = 60.0  # collectors send a heartbeat every second
MAX_ATTEMPT_STEP = 5


class JobKindConflict(Conflict):
    """The batch names a job of the other kind that is still reporting."""


@dataclass(frozen=True)
class Launch:
    job_id: int
    attempt: int  # the job's current attempt, after this batch
    current: bool  # whether the batch belongs to it


def follow_launch(
    *,
    session: Session,
    name: str,
    kind: str,
    world_size: int,
    attempt: int,
    now: datetime | None = None,
) -> Launch:
    """Find or create the job and decide whether the batch belongs to its current launch
    (moving the job to the batch's launch when it starts one). The job row is written only
    when something about it changes, so concurrent batches from many ranks do not queue on
    one row lock."""
    columns = (Job.id, Job.kind, Job.world_size, Job.attempt)
    row = session.execute(select(*columns).where(Job.name == name)).first()
    if row is None:
        session.execute(
            insert_for(session, Job)
            .values(
                name=name, kind=kind, world_size=world_size, attempt=attempt, created_at=utcnow()
            )
            .on_conflict_do_nothing(index_elements=["name"])
        )
        row = session.execute(select(*columns).where(Job.name == name)).one()
    job_id, cur_kind, cur_world, cur_attempt = row
    if kind == cur_kind and attempt == cur_attempt:
        if world_size != cur_world:  # elastic jobs, evicted ranks
            session.execute(update(Job).where(Job.id == job_id).values(world_size=world_size))
        return Launch(job_id, cur_attempt, True)
    restart = kind == cur_kind and cur_attempt < attempt <= cur_attempt + MAX_ATTEMPT_STEP
    if not restart and launch_is_live(
        session=session, job_id=job_id, attempt=cur_attempt, now=now or utcnow()
    ):
        if kind != cur_kind:
            raise JobKindConflict(
                f"job {name!r} is a {cur_kind} job that is still reporting; {kind} batches "
                f"under its name are refused until it has been silent for "
                f"{RELAUNCH_QUIET_S:.0f} s (give this {kind} job another name)"
            )
        return Launch(job_id, cur_attempt, False)
    session.execute(
        update(Job)
        .where(Job.id == job_id)
        .values(kind=kind, attempt=attempt, world_size=world_size)
    )
    return Launch(job_id, attempt, True)


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
