"""Runs: each launch of a job name, its state, and whether anyone is left to act on.

A job is a name; every launch of it is a **run**, told apart by the key its collectors send
(``run`` in the batch header: ``vigil run``'s ``VIGIL_RUN_ID``, torchrun's
``TORCHELASTIC_RUN_ID``) or, for collectors that send none, by the server noticing that the
launch it followed is over (``backend.jobs.launches``). Restart attempts happen inside a run.

**Why runs get attempt ranges, not a column on every row.** Telemetry keeps
``(job_id, attempt)`` as before. Run *n* stores its attempt *a* as the job-wide attempt
``(n - 1) * ATTEMPTS_PER_RUN + a`` (``Run.first_attempt``), so attempt numbers never repeat
across runs. The detection window still loads "the job's current attempt" by one indexed
column (``backend.detection.window``), the hot ingest path writes the same rows and reads
the same one job row, and no index changes. The API shows people the run's own attempt
(torchrun's restart count) next to the run: :class:`RunMap` translates. (A ``run_id``
column on steps and collectives would have meant wider rows on the hottest tables, a new
index for the window's query, and the same translation for every attempt anyway.)

Limits: the charts' rollups bin a job's steps by step number, whatever the run, so a chart
spanning two runs overlays them (the steps API, ``?run=``, and detection keep them
apart). Without a key, a relaunch is told apart only when its attempt differs from the
current one (``backend.jobs.launches``): one at the same attempt is taken for late data
of the last launch (a batch may well arrive after its rank's goodbye). This repo's
collector always sends a key when its launcher gives one, and a lone process makes its own.

**State.** ``running`` until every rank of the run's current attempt is gone; then

- ``finished``: each said goodbye (``exiting`` heartbeat) with exit code 0 or none;
- ``failed``: a goodbye carried another exit code (an uncaught exception, an exit for a
  restart that no launcher carried out);
- ``lost``: ranks stopped reporting without a goodbye.

A clean finish is taken at once; anything else waits ``RELAUNCH_QUIET_S`` after the last
rank was seen, since torchrun may restart the group (a new attempt of the same run). A run
that a later launch took over is ended when that happens (``judge(final=True)``).
Judging is the sweep's (``backend.jobs.run_end.settle_runs``); what an ended run's open
incidents and actions become is ``backend.jobs.run_end``'s.

    run_map(session=s, job_id=7).locate(10_003)   # (Run #2, attempt 2)
    refusal(session=s, job_id=7, now=utcnow())    # None, or why nobody can act now
"""

from __future__ import annotations

import bisect
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from backend.errors import Conflict, NotFound
from backend.ingest.schemas import MAX_ATTEMPT, MAX_INT32
from backend.jobs.models import Job, Rank, Run
from detectors.hang import _ranks_text as ranks_text  # "ranks 0, 1 and 6 more": said once

ATTEMPTS_PER_RUN = MAX_ATTEMPT + 1
MAX_RUNS = MAX_INT32 // ATTEMPTS_PER_RUN  # every stored attempt fits its INTEGER column
RELAUNCH_QUIET_S = 60.0  # collectors send a heartbeat every second
# A rank that has not said goodbye and was seen this recently can still receive an action.
LIVE_RANK_S = 15.0
ENDED_STATES = ("finished", "failed", "lost")


class RunNotLive(Conflict):
    """Nobody is left to act on: the job's run ended, or none of its ranks is reporting."""

    code = "run_not_live"


@dataclass(frozen=True)
class Verdict:
    state: str  # one of RUN_STATES
    reason: str = ""


def new_key(now: datetime) -> str:
    """A key for a run whose collectors sent none: its start time, made unique."""
    return f"{now:%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:6]}"


def start_run(*, session: Session, job_id: int, key: str, kind: str, now: datetime) -> Run:
    """A new run of the job, numbered after its last one. Call with the job row locked
    (``backend.jobs.launches`` does), so two launches never take the same number."""
    last = session.scalar(select(func.max(Run.number)).where(Run.job_id == job_id)) or 0
    if last >= MAX_RUNS:
        raise Conflict(f"the job has had {last} runs, the most one name can hold: use a new name")
    run = Run(
        job_id=job_id,
        key=key[:128],
        number=last + 1,
        kind=kind,
        first_attempt=last * ATTEMPTS_PER_RUN,
        started_at=now,
        state="running",
        reason="",
    )
    session.add(run)
    session.flush()
    return run


def latest_run(*, session: Session, job_id: int, key: str) -> Run | None:
    """The newest run of the job with this key (a key a relaunch reused names several)."""
    query = select(Run).where(Run.job_id == job_id, Run.key == key)
    return session.scalars(query.order_by(Run.number.desc()).limit(1)).first()


def attempt_ranks(*, session: Session, job_id: int, attempt: int) -> list[Rank]:
    """The job's ranks whose latest state is of this (job-wide) attempt."""
    query = select(Rank).where(Rank.job_id == job_id, Rank.attempt == attempt)
    return list(session.scalars(query.order_by(Rank.rank)))


def judge(ranks: Sequence[Rank], *, now: datetime, final: bool = False) -> Verdict:
    """The state of a run from its current attempt's ranks. ``final``: the run is over
    (a later launch took over), so it is not waited on."""
    if not ranks:
        return Verdict("lost", "no rank of it reported") if final else Verdict("running")
    if all(r.exited and not r.exit_code for r in ranks):
        return Verdict("finished", f"every rank ({len(ranks)}) exited cleanly")
    quiet_since = now - timedelta(seconds=RELAUNCH_QUIET_S)
    if not final and max(r.last_seen_at for r in ranks) >= quiet_since:
        return Verdict("running")  # a rank still reports, or a restart may follow
    failing = [r for r in ranks if r.exited and r.exit_code]
    if failing:
        codes = ", ".join(f"rank {r.rank}: {r.exit_code}" for r in failing[:8])
        more = f" and {len(failing) - 8} more" if len(failing) > 8 else ""
        return Verdict("failed", f"exited with a failing code ({codes}{more})")
    silent = [r.rank for r in ranks if not r.exited]
    return Verdict("lost", f"{ranks_text(silent)} stopped reporting without saying goodbye")


def end_run(*, run: Run, verdict: Verdict, now: datetime) -> None:
    """Record the end of a run (its incidents and actions are settled by the sweep)."""
    state = verdict.state if verdict.state in ENDED_STATES else "lost"
    run.state, run.ended_at, run.reason = state, now, verdict.reason[:2000]


# -- reading runs -------------------------------------------------------------------------


class RunMap:
    """A job's runs by attempt range: which run a stored (job-wide) attempt belongs to."""

    def __init__(self, runs: Sequence[Run]) -> None:
        self.runs = sorted(runs, key=lambda r: r.first_attempt)
        self._starts = [r.first_attempt for r in self.runs]

    def locate(self, attempt: int) -> tuple[Run | None, int]:
        """``(run, the run's own attempt)``; ``(None, attempt)`` before any run."""
        i = bisect.bisect_right(self._starts, attempt) - 1
        if i < 0:
            return None, attempt
        run = self.runs[i]
        return run, attempt - run.first_attempt


def list_runs(*, session: Session, job_id: int) -> list[Run]:
    """The job's runs, newest first."""
    query = select(Run).where(Run.job_id == job_id).order_by(Run.number.desc())
    return list(session.scalars(query))


def require_run(*, session: Session, job_id: int, job: str, number: int) -> Run:
    """Run ``number`` of the job; ``NotFound`` (404) naming the job and the run when it has
    no such run (``?run=`` of the steps and chart routes)."""
    run = session.scalar(select(Run).where(Run.job_id == job_id, Run.number == number))
    if run is None:
        raise NotFound(f"job {job!r} has no run {number}")
    return run


def run_count(*, session: Session, job_id: int) -> int:
    return session.scalar(select(func.count()).where(Run.job_id == job_id)) or 0


def run_map(*, session: Session, job_id: int) -> RunMap:
    return RunMap(list_runs(session=session, job_id=job_id))


def current_run(*, session: Session, job_id: int) -> Run | None:
    run_id = session.scalar(select(Job.run_id).where(Job.id == job_id))
    return None if run_id is None else session.get(Run, run_id)


def live_ranks(*, session: Session, run: Run, now: datetime) -> list[int]:
    """Ranks of the run that have not said goodbye and reported within ``LIVE_RANK_S``."""
    since = now - timedelta(seconds=LIVE_RANK_S)
    query = select(Rank.rank).where(
        Rank.job_id == run.job_id,
        Rank.attempt >= run.first_attempt,
        Rank.attempt < run.first_attempt + ATTEMPTS_PER_RUN,
        Rank.exited.is_(False),
        Rank.last_seen_at >= since,
    )
    return list(session.scalars(query.order_by(Rank.rank)))


def refusal(
    *, session: Session, job_id: int, now: datetime, attempt: int | None = None
) -> str | None:
    """Why an action on the job cannot reach anyone now, or None when it can: its run
    ended, no rank of it reported within ``LIVE_RANK_S``, or (with the action's
    ``attempt``) the action was made for an earlier run. A job no rank has reported for
    yet has no run: an action waits for its first ranks (and expires if none come)."""
    name = session.scalar(select(Job.name).where(Job.id == job_id))
    run = current_run(session=session, job_id=job_id)
    if run is None:
        return None
    label = f"run #{run.number} of job {name!r}"
    if attempt is not None and not belongs(run, attempt):
        return f"the action was made for an earlier run of job {name!r}; {label} is current"
    if run.state != "running":
        ended = f"{run.ended_at:%Y-%m-%d %H:%M:%S} UTC" if run.ended_at else "already"
        return f"{label} {run.state} {ended} ({run.reason}): no rank is left to act"
    if not live_ranks(session=session, run=run, now=now):
        return (
            f"{label} has no live rank: none reported in the last {LIVE_RANK_S:.0f} s "
            "without saying goodbye, so no process would receive the action"
        )
    return None


def require_live(
    *, session: Session, job_id: int, now: datetime, attempt: int | None = None
) -> None:
    """Raise :class:`RunNotLive` (a 409) with :func:`refusal`'s reason, if there is one."""
    why = refusal(session=session, job_id=job_id, now=now, attempt=attempt)
    if why is not None:
        raise RunNotLive(why)


def belongs(run: Run, attempt: int) -> bool:
    """Whether a job-wide attempt number is one of the run's."""
    return run.first_attempt <= attempt < run.first_attempt + ATTEMPTS_PER_RUN


def current_run_number(*, session: Session, job_id: int) -> int:
    """The number of the job's current run (1 for a job without runs)."""
    query = select(Run.number).join(Job, Job.run_id == Run.id).where(Job.id == job_id)
    return session.scalar(query) or 1


def run_over(*, session: Session, job_id: int) -> bool:
    """Whether the job's current run has ended (its late data opens no incident)."""
    query = select(Run.state).join(Job, Job.run_id == Run.id).where(Job.id == job_id)
    return session.scalar(query) in ENDED_STATES


def run_ranks(*, session: Session, job_id: int) -> list[Rank]:
    """The ranks whose latest state is of the job's current run (a rank of an earlier run
    that this one does not have is no rank of it)."""
    run = current_run(session=session, job_id=job_id)
    query = select(Rank).where(Rank.job_id == job_id)
    if run is not None:
        query = query.where(Rank.attempt >= run.first_attempt)
    return list(session.scalars(query.order_by(Rank.rank)))
