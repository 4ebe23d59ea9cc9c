"""Load the parts of a detection window (:mod:`detectors.window`) from the store.

``load_steps``: the job's last ``width`` steps of its current restart attempt, pivoted to
rank × step arrays with NaN where a rank did not report, and each rank's device memory
(``ranks.mem_capacity``), from the rows ``backend.detection.step_cache`` keeps;
``load_liveness``: every rank's latest state for the hang and crash sweep (from SQL merged
with Redis, where distributed mode keeps heartbeats: ``backend.telemetry.liveness``);
``load_serving``: a serving job's per-minute SLO counts and per-replica sums. The
collectives: ``backend.detection.collectives``.
"""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from backend.actions.models import Action
from backend.actions.service import RESTARTING_KINDS
from backend.detection.collectives import group_members
from backend.detection.step_cache import COLUMNS, STEP_COLUMNS, step_rows
from backend.jobs.models import Job, Rank
from backend.jobs.rank_state import RankLive
from backend.jobs.runs import current_run, run_ranks
from backend.slos.models import Slo
from backend.slos.service import minute_counts, period_counts
from backend.telemetry.liveness import States, overlay
from backend.telemetry.models import ServingMinute, StepRecord
from detectors import burn_rate
from detectors.window import (
    Inflight,
    LivenessWindow,
    RankState,
    ServingWindow,
    SloSeries,
    StepWindow,
)


def load_steps(
    *, session: Session, job_id: int, width: int = 200, cached: bool = True
) -> StepWindow | None:
    """The job's last ``width`` steps of its current attempt as rank × step arrays, NaN
    where a rank did not report; None before its first step. The rows come from
    :mod:`backend.detection.step_cache`, which reads only those that may have changed since
    this process last loaded the job (``cached=False``: all of them)."""
    job = session.execute(
        select(Job.attempt, Job.world_size, Job.created_at).where(Job.id == job_id)
    ).first()
    data = step_rows(
        session=session,
        job_id=job_id,
        attempt=(job.attempt if job else 0) or 0,
        world=(job.world_size if job else 0) or 0,
        created=job.created_at if job else None,
        width=width,
        cached=cached,
    )
    if not len(data):
        return None
    loss_sent = data[:, COLUMNS.index("loss_sent")] == 1.0
    grad_sent = data[:, COLUMNS.index("grad_sent")] == 1.0
    ranks = np.unique(data[:, 0]).astype(np.int64)
    steps = np.unique(data[:, 1]).astype(np.int64)
    ri = np.searchsorted(ranks, data[:, 0].astype(np.int64))
    si = np.searchsorted(steps, data[:, 1].astype(np.int64))
    arrays = {}
    for col, name in enumerate(STEP_COLUMNS, start=2):
        grid = np.full((len(ranks), len(steps)), np.nan)
        grid[ri, si] = data[:, col]
        arrays[name] = grid
    reported = np.zeros((len(ranks), len(steps)), dtype=bool)
    reported[ri, si] = loss_sent
    grad_reported = np.zeros_like(reported)
    grad_reported[ri, si] = grad_sent
    world = (job.world_size if job else 0) or len(ranks)
    return StepWindow(
        loss_reported=reported,
        grad_reported=grad_reported,
        world_size=max(int(world), int(ranks.max()) + 1),
        steps=steps,
        ranks=ranks,
        step_time=arrays["duration_s"],
        comm_time=arrays["comm_s"],
        data_time=arrays["data_s"],
        loss=arrays["loss"],
        grad_norm=arrays["grad_norm"],
        mem_bytes=arrays["mem_bytes"],
        mem_capacity=mem_capacity(session=session, job_id=job_id, ranks=ranks),
        older_steps=steps.size >= width,  # only the last ``width`` were read
    )


def mem_capacity(*, session: Session, job_id: int, ranks: np.ndarray) -> np.ndarray | None:
    """``(R,)`` device memory of each of ``ranks`` in bytes, as their heartbeats report it
    (NaN for a rank that has not); None when no rank has, so ``memory_pressure`` waits."""
    known = dict(
        session.execute(
            select(Rank.rank, Rank.mem_capacity).where(
                Rank.job_id == job_id, Rank.mem_capacity.is_not(None)
            )
        ).all()
    )
    if not known:
        return None
    return np.array([known.get(int(r), np.nan) for r in ranks], dtype=float)


LIVE_S = 30.0  # a rank silent this long behind the job's newest report is not waited for


def live_ranks(*, session: Session, job: Job) -> int:
    """Ranks of the job's current attempt that have not said goodbye and reported (a
    heartbeat or a step) within ``LIVE_S`` of the job's newest report: the ones whose steps
    detection waits for (``detectors.settle``). Measured against the job's own clock, not
    the server's, so a replay of old data settles the same way as a live job. Reads the
    ranks' latest state where it lives (``backend.telemetry.liveness``)."""
    rows = session.execute(
        select(
            Rank.rank, Rank.attempt, Rank.exited, Rank.last_heartbeat_ts, Rank.last_step_ts
        ).where(Rank.job_id == job.id, Rank.attempt == job.attempt)
    ).all()
    seen = [
        max(ts)
        for r in overlay(rows, job_id=job.id)
        if not r.exited
        and r.attempt == job.attempt
        and (ts := [t for t in (r.last_heartbeat_ts, r.last_step_ts) if t is not None])
    ]
    if not seen:
        return 0
    newest = max(seen)
    return sum(1 for t in seen if t >= newest - LIVE_S)


def recent_step_durations(*, session: Session, job_id: int, steps: int = 50) -> list[float]:
    """The job's step times over its last ``steps`` steps (slowest rank per step: in
    synchronous training that is the job's step time), to learn the hang timeout."""
    attempt = session.scalar(select(Job.attempt).where(Job.id == job_id)) or 0
    return list(
        session.scalars(
            select(func.max(StepRecord.duration_s))
            .where(StepRecord.job_id == job_id, StepRecord.attempt == attempt)
            .group_by(StepRecord.step)
            .order_by(StepRecord.step.desc())
            .limit(steps)
        )
    )


def load_liveness(
    *, session: Session, job_id: int, now: float, live: States | None = None
) -> LivenessWindow:
    """Every rank that has not said goodbye, as the hang detector sees it, at ``now``.
    For a serving job only processes that send heartbeats are judged (a replay client
    shipping request records says nothing about liveness), and all of them falling
    silent together is a stop, not a crash. Only ranks of the job's current run count
    (``backend.jobs.runs``); once one of them left cleanly the run is finishing, and the
    rest falling silent together is its end, not a crash. Likewise while a restart Vigil
    sent is under way (:func:`_restart_under_way`): the ranks leave together for it, and a
    goodbye lost at exit on a busy host must not make that a crash (and a second restart).
    A rank that falls silent well before the others is still a crash either way.
    ``live``: what Redis holds of the ranks, when the caller read it already."""
    serving = session.scalar(select(Job.kind).where(Job.id == job_id)) == "serving"
    ranks = overlay(run_ranks(session=session, job_id=job_id), job_id=job_id, states=live)
    finishing = any(r.exited and not r.exit_code for r in ranks)
    finishing = finishing or _restart_under_way(session=session, job_id=job_id, now=now)
    states = [
        RankState(
            rank=r.rank,
            last_step=r.last_step,
            current_step=r.current_step,
            last_step_ts=r.last_step_ts,
            last_heartbeat_ts=r.last_heartbeat_ts
            if r.last_heartbeat_ts is not None
            else (r.last_step_ts or 0.0),
            inflight=_inflight(r.inflight),
            host=r.host,
        )
        for r in ranks
        if not r.exited and (not serving or r.last_heartbeat_ts is not None)
    ]
    durations = recent_step_durations(session=session, job_id=job_id) if states else []
    unreported, started_ts = _unreported(session=session, job_id=job_id, ranks=ranks)
    return LivenessWindow(
        states=states,
        now=now,
        step_durations=np.asarray(durations, dtype=float),
        groups=_groups(session=session, job_id=job_id, states=states) or None,
        expect_running=not serving and not finishing,
        unreported=() if serving else unreported,
        started_ts=started_ts,
        exited={r.rank: _last_heard(r) for r in ranks if r.exited},
    )


def _groups(*, session: Session, job_id: int, states: list[RankState]) -> dict[str, list[int]]:
    """The members of the groups the ranks are blocked in (the hang's wait graph needs no
    others), from the records of the job's last ``GROUP_LOOKBACK_STEPS`` steps."""
    names = {s.inflight.group for s in states if s.inflight is not None}
    newest = max((s.last_step for s in states if s.last_step is not None), default=None)
    if not names or newest is None:
        return {}
    return group_members(
        session=session,
        job=session.get(Job, job_id),
        names=names,
        since_step=newest - GROUP_LOOKBACK_STEPS,
    )


GROUP_LOOKBACK_STEPS = 200


def _last_heard(rank: RankLive) -> float:
    return max(t for t in (rank.last_heartbeat_ts, rank.last_step_ts, 0.0) if t is not None)


def _unreported(
    *, session: Session, job_id: int, ranks: list[RankLive]
) -> tuple[tuple[int, ...], float | None]:
    """Ranks of the job's world that have sent nothing in its current run, and when the run
    was first seen (epoch seconds)."""
    world = session.scalar(select(Job.world_size).where(Job.id == job_id)) or 0
    run = current_run(session=session, job_id=job_id)
    seen = {r.rank for r in ranks}
    missing = tuple(r for r in range(world) if r not in seen)
    started = run.started_at.timestamp() if run is not None else None
    return missing, started


RESTART_GRACE_S = 300.0  # how long after a restart reached the ranks their silence is expected


def _restart_under_way(*, session: Session, job_id: int, now: float) -> bool:
    """Whether a restarting action (restart, rollback, evict) reached the ranks of the
    job's current attempt within ``RESTART_GRACE_S``: the launcher tears the whole group
    down when one rank exits for it, so every rank of this attempt is expected to stop."""
    attempt = session.scalar(select(Job.attempt).where(Job.id == job_id))
    since = datetime.fromtimestamp(now - RESTART_GRACE_S, tz=UTC)
    found = session.scalar(
        select(Action.id)
        .where(
            Action.job_id == job_id,
            Action.attempt == attempt,
            Action.kind.in_(RESTARTING_KINDS),
            Action.state.in_(("dispatched", "acked", "succeeded")),
            Action.updated_at >= since,
        )
        .limit(1)
    )
    return found is not None


def _inflight(raw: dict[str, object] | None) -> Inflight | None:
    if not raw:
        return None
    try:
        peers = raw.get("peers")
        return Inflight(
            group=str(raw["group"]),
            op=str(raw["op"]),
            seq=int(raw.get("seq") or 0),  # type: ignore[call-overload]
            since=float(raw["since"]),  # type: ignore[arg-type]
            peers=None if peers is None else tuple(int(p) for p in peers),  # type: ignore[attr-defined]
        )
    except (KeyError, TypeError, ValueError):
        return None


SERVING_REPLICA_MINUTES = 60  # how far back the per-replica arrays reach


def load_serving(*, session: Session, job_id: int, now: float) -> ServingWindow | None:
    """A serving job's minutes up to ``now``: per SLO, as far back as its longest burn-rate
    window; per replica, the last hour (earlier minutes are zeros). None for other jobs."""
    job = session.execute(select(Job.name, Job.kind).where(Job.id == job_id)).first()
    if job is None or job.kind != "serving":
        return None
    slos = list(session.scalars(select(Slo).where(Slo.job == job.name).order_by(Slo.id)))
    last = int(now // 60)
    span = max(
        [SERVING_REPLICA_MINUTES]
        + [w.long_minutes for s in slos for w in burn_rate.windows_for(s.period_s)]
    )
    first = last - span + 1
    series = []
    for slo in slos:
        counts = minute_counts(session=session, slo_id=slo.id, first_minute=first, last_minute=last)
        period = period_counts(session=session, slo=slo, now=now)
        series.append(
            SloSeries(
                slo_id=slo.id,
                name=slo.name,
                objective=slo.objective,
                period_s=slo.period_s,
                total=counts["total"],
                good=counts["good"],
                period_total=period[0],
                period_good=period[1],
            )
        )
    rows = session.execute(
        select(ServingMinute).where(
            ServingMinute.job_id == job_id,
            ServingMinute.minute >= last - SERVING_REPLICA_MINUTES + 1,
            ServingMinute.minute <= last,
        )
    ).scalars()
    by_replica: dict[str, list[ServingMinute]] = {}
    for row in rows:
        by_replica.setdefault(row.replica, []).append(row)
    replicas = tuple(sorted(by_replica))
    arrays = {c: np.zeros((len(replicas), span)) for c in _REPLICA_SUMS}
    for p, replica in enumerate(replicas):
        for row in by_replica[replica]:
            for c in _REPLICA_SUMS:
                arrays[c][p, row.minute - first] = getattr(row, c)
    return ServingWindow(
        now=now,
        minutes=np.arange(first, last + 1, dtype=np.int64),
        slos=series,
        replicas=replicas,
        **arrays,
    )


_REPLICA_SUMS = (
    "requests",
    "errors",
    "ttft_sum",
    "ttft_n",
    "tpot_sum",
    "tpot_n",
    "queue_sum",
    "queue_n",
    "arrivals",
)
