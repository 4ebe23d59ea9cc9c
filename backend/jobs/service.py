"""Queries behind the jobs read API. Services take a session and keyword arguments."""

from __future__ import annotations

import base64
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, case, func, or_, select, tuple_
from sqlalchemy.orm import Session

from backend.db import utcnow
from backend.errors import NotFound
from backend.incidents.models import Incident
from backend.jobs.models import Job, Rank, Run
from backend.jobs.runs import ATTEMPTS_PER_RUN, LIVE_RANK_S, list_runs, run_map
from backend.telemetry.binning import RunRows
from backend.telemetry.liveness import overlay
from backend.telemetry.models import ROLLUP_WIDTHS, StepRecord, StepRollup
from backend.telemetry.queries import median_recent_step_s


def _rank_rollup(now: datetime) -> Any:
    """Per job, over the ranks of its current run: the last step, when one was last seen,
    and how many report now (no goodbye, seen within ``LIVE_RANK_S``)."""
    live = and_(Rank.exited.is_(False), Rank.last_seen_at >= now - timedelta(seconds=LIVE_RANK_S))
    return (
        select(
            Rank.job_id,
            func.max(Rank.last_step).label("last_step"),
            func.max(Rank.last_seen_at).label("last_seen_at"),
            func.count(case((live, 1))).label("ranks_reporting"),
        )
        .join(Job, Job.id == Rank.job_id)
        .outerjoin(Run, Run.id == Job.run_id)
        .where(Rank.attempt >= func.coalesce(Run.first_attempt, 0))
        .group_by(Rank.job_id)
        .subquery()
    )


def _summary(row: Any) -> dict[str, Any]:
    job, run = row[0], row[1]
    return {
        "name": job.name,
        "kind": job.kind,
        "world_size": job.world_size,
        "attempt": job.attempt - (run.first_attempt if run is not None else 0),
        "created_at": job.created_at,
        "last_seen_at": row.last_seen_at,
        "last_step": row.last_step,
        "ranks_reporting": row.ranks_reporting or 0,
        "state": run.state if run is not None else None,
        "run": run_out(run) if run is not None else None,
    }


def run_out(run: Run) -> dict[str, Any]:
    """A run as the API shows it (``RunOut``)."""
    return {
        "number": run.number,
        "key": run.key,
        "kind": run.kind,
        "state": run.state,
        "started_at": run.started_at,
        "ended_at": run.ended_at,
        "reason": run.reason,
    }


def _jobs_query() -> Any:
    r = _rank_rollup(utcnow())
    return (
        select(Job, Run, r.c.last_step, r.c.last_seen_at, r.c.ranks_reporting)
        .outerjoin(Run, Run.id == Job.run_id)
        .outerjoin(r, r.c.job_id == Job.id)
    )


def list_jobs(*, session: Session) -> list[dict[str, Any]]:
    query = _jobs_query()
    rows = session.execute(
        query.order_by(query.selected_columns.last_seen_at.desc().nulls_last(), Job.name)
    )
    return [_summary(row) for row in rows]


def get_job_id(*, session: Session, name: str) -> int | None:
    return session.scalar(select(Job.id).where(Job.name == name))


def require_job_id(*, session: Session, name: str) -> int:
    """The job's id; ``NotFound`` (404) when no job has that name."""
    job_id = get_job_id(session=session, name=name)
    if job_id is None:
        raise NotFound(f"job {name!r} not found")
    return job_id


def get_job(*, session: Session, name: str) -> dict[str, Any] | None:
    row = session.execute(_jobs_query().where(Job.name == name)).first()
    if row is None:
        return None
    job_id = row[0].id
    out = _summary(row)
    out["runs"] = [run_out(r) for r in list_runs(session=session, job_id=job_id)]
    out["steps_stored"] = steps_stored(session=session, job_id=job_id)
    out["step_time_median_s"] = step_time_s(
        session=session, job_id=job_id, run=row[1], last_step=row.last_step
    )
    out["open_incidents"] = session.scalar(
        select(func.count())
        .select_from(Incident)
        .where(Incident.job_id == job_id, Incident.status == "open")
    )
    return out


def step_time_s(
    *, session: Session, job_id: int, run: Run | None, last_step: int | None = None
) -> float | None:
    """The median recent step time of one run of the job: what the jobs list and the job
    API show (of the job's current run), and the job page (of the run it draws). ``None``
    for ``run``: a job no run was recorded for, every step row. ``last_step``: the run's
    last step, where known (``median_recent_step_s`` says why)."""
    rows = None if run is None else RunRows.of(run, alone=False)
    return median_recent_step_s(session=session, job_id=job_id, run=rows, to_step=last_step)


def steps_stored(*, session: Session, job_id: int) -> int:
    """Step rows of the job: summed from the coarsest rollups (a few rows per rank) when
    ingest keeps them, else counted."""
    top = len(ROLLUP_WIDTHS) - 1
    total = session.scalar(
        select(func.sum(StepRollup.n)).where(StepRollup.job_id == job_id, StepRollup.level == top)
    )
    if total is not None:
        return int(total)
    query = select(func.count()).select_from(StepRecord).where(StepRecord.job_id == job_id)
    return int(session.scalar(query) or 0)


@dataclass(frozen=True)
class StepCursor:
    """Keyset position (step, rank, id): stable under concurrent inserts, O(1) per page."""

    step: int
    rank: int
    id: int

    def encode(self) -> str:
        return base64.urlsafe_b64encode(f"{self.step}:{self.rank}:{self.id}".encode()).decode()

    @classmethod
    def decode(cls, text: str) -> StepCursor:
        try:
            step, rank, id_ = base64.urlsafe_b64decode(text.encode()).decode().split(":")
            return cls(int(step), int(rank), int(id_))
        except ValueError as exc:
            raise ValueError("cursor is not one this API returned") from exc


def list_steps(
    *,
    session: Session,
    job_id: int,
    rank: int | None = None,
    from_step: int | None = None,
    to_step: int | None = None,
    limit: int = 1000,
    after: StepCursor | None = None,
    run: Run | None = None,
) -> tuple[list[StepRecord], StepCursor | None]:
    """Steps ordered by (step, rank), filtered (``run``: that run's attempts only), one
    page at a time."""
    query = select(StepRecord).where(StepRecord.job_id == job_id)
    if run is not None:
        query = query.where(
            StepRecord.attempt >= run.first_attempt,
            StepRecord.attempt < run.first_attempt + ATTEMPTS_PER_RUN,
        )
    if rank is not None:
        query = query.where(StepRecord.rank == rank)
    if from_step is not None:
        query = query.where(StepRecord.step >= from_step)
    if to_step is not None:
        query = query.where(StepRecord.step <= to_step)
    if after is not None:
        key = tuple_(StepRecord.step, StepRecord.rank, StepRecord.id)
        if session.get_bind().dialect.name == "sqlite":
            # Row-value comparison exists in SQLite too, but spelled out it uses the index.
            query = query.where(
                or_(
                    StepRecord.step > after.step,
                    and_(StepRecord.step == after.step, StepRecord.rank > after.rank),
                    and_(
                        StepRecord.step == after.step,
                        StepRecord.rank == after.rank,
                        StepRecord.id > after.id,
                    ),
                )
            )
        else:
            query = query.where(key > tuple_(after.step, after.rank, after.id))
    query = query.order_by(StepRecord.step, StepRecord.rank, StepRecord.id).limit(limit + 1)
    rows = list(session.scalars(query))
    if len(rows) <= limit:
        return rows, None
    rows = rows[:limit]
    last = rows[-1]
    return rows, StepCursor(last.step, last.rank, last.id)


def list_ranks(*, session: Session, job_id: int, now: float) -> list[dict[str, Any]]:
    """Each rank's latest state (where it lives: ``backend.telemetry.liveness``), with its
    run's number and the attempt within that run."""
    query = select(Rank).where(Rank.job_id == job_id).order_by(Rank.rank)
    rows = overlay(session.scalars(query), job_id=job_id)
    runs = run_map(session=session, job_id=job_id)
    out = []
    for r in rows:
        age = None if r.last_heartbeat_ts is None else max(0.0, now - r.last_heartbeat_ts)
        run, attempt = runs.locate(r.attempt)
        out.append(
            {
                "rank": r.rank,
                "host": r.host,
                "run": run.number if run is not None else None,
                "attempt": attempt,
                "last_step": r.last_step,
                "current_step": r.current_step,
                "last_step_ts": r.last_step_ts,
                "last_heartbeat_ts": r.last_heartbeat_ts,
                "heartbeat_age_s": age,
                "inflight": r.inflight,
                "pid": r.pid,
                "exited": r.exited,
                "exit_code": r.exit_code,
                "drops": r.drops,
                "last_seen_at": r.last_seen_at,
            }
        )
    return out
