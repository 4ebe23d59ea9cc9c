"""Goodput of a training job: gather its timeline, incidents and saves, then account.

    from backend.goodput.service import job_goodput
    job_goodput(session=session, job_id=7)
    # -> {"job": "llama-8b-pretrain", "total_s": 192.0, "productive_s": 100.0,
    #     "goodput": 0.52, "badput": {"wasted_progress": 30.0, ...}, "restarts": 1,
    #     "steps_lost": 30, "steps_productive": 100, "as_of": datetime(...)}

The accounting itself is ``detectors.goodput.account`` (its docstring defines every
category). What this module decides:

- **One timeline**: the steps of the *lowest rank that reported steps* (in synchronous
  training every rank has the same timeline), one row per (attempt, step) via ``GROUP BY``.
  It reads one rank's rows through the ``(job_id, rank, step)`` index, never the whole job's
  (1,000 ranks × 100,000 steps would be 10⁸ rows).
- **The window end**: the job's last activity (latest heartbeat or step of any rank), but
  never after ``now`` (default: the clock). Data after ``now`` is left out, so ``now`` in
  the past answers "what was the goodput then".
- **Hangs**: ``hang`` incidents, from ``detected_at`` to ``resolved_at`` (still open, or
  resolved after ``now``: hung to the end of its segment). Detection times off the step
  timeline (imported data) fall back to the end of the step before ``first_step``. The
  survivors' hang inside a ``crash`` incident is not a hang here: it is downtime.
- **Stragglers**: ``straggler`` incidents, from the start of ``first_step`` (the onset the
  detector reports) to ``resolved_at``, bounded by the evidence's ``last_step`` once resolved.
- **Checkpoints**: ``checkpoint_saved`` events of the lowest rank that sent any; the step
  is the event's, else ``attrs["step"]`` (what ``vigil.event("checkpoint_saved", step=…)``
  sends between steps); ``attrs["duration_s"]`` when the script reports it.
- **Runs** (each launch of the job name, ``backend.jobs.runs``): the job is one timeline
  across its runs, so a run that starts over at a step an earlier run reached redoes it
  (wasted progress, as after a rollback). The time from one run's last step to the next
  run's first step is ``between_runs``: the job was down, relaunched, not restarted inside
  a run (``disruption_recovery`` keeps the restarts inside runs; ``restarts`` counts only
  those). ``run=N`` accounts that run alone: its attempts, its incidents, its window (up
  to its last step, or the job's last activity for the current run).
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import numpy as np
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from backend.incidents.models import Incident
from backend.incidents.service import fingerprint
from backend.jobs.models import Job, Rank, Run
from backend.jobs.runs import ATTEMPTS_PER_RUN, RunMap, run_map
from backend.telemetry.models import JobEvent, StepRecord
from detectors.goodput import Attempt, CheckpointSave, Hang, Straggler, account

SAVE_EVENT = "checkpoint_saved"


def job_goodput(
    *, session: Session, job_id: int, now: float | None = None, run: int | None = None
) -> dict[str, Any] | None:
    """The job's goodput as of ``now`` (epoch seconds), or run ``run``'s alone; ``None`` if
    there is no such job (or run)."""
    job = session.get(Job, job_id)
    if job is None:
        return None
    now = time.time() if now is None else now
    runs = run_map(session=session, job_id=job_id)
    only = None
    if run is not None:
        only = next((r for r in runs.runs if r.number == run), None)
        if only is None:
            return None
    timeline = load_timeline(session=session, job_id=job_id, now=now, run=only)
    if only is None or only.id == job.run_id:
        end = _window_end(session, job_id, now, timeline)
    else:  # an earlier run: its ranks' live state is the later runs' now
        end = min(float(timeline[:, 2].max()), now) if timeline.size else now
    attempts = _attempts(timeline)
    checkpoints = load_saves(session=session, job_id=job_id, now=now)
    intervals = _incident_intervals(session, job_id, now=now, end=end, timeline=timeline, run=only)
    g = account(attempts, end=end, checkpoints=checkpoints, **intervals)
    by_run = _by_run(attempts, runs)
    badput = _between_runs(g.badput, by_run, checkpoints=checkpoints, hangs=intervals["hangs"])
    return {
        "job": job.name,
        "run": run,
        "total_s": g.total_s,
        "productive_s": g.productive_s,
        "goodput": g.goodput,
        "badput": badput,
        "restarts": sum(group[-1].attempt - group[0].attempt for group in by_run),
        "steps_lost": g.steps_lost,
        "steps_productive": g.steps_productive,
        "as_of": datetime.fromtimestamp(g.end, UTC),
    }


def _by_run(attempts: list[Attempt], runs: RunMap) -> list[list[Attempt]]:
    """The attempts grouped by the run they belong to, in order (attempts ascend)."""
    groups: dict[int, list[Attempt]] = {}
    for a in attempts:
        owner, _ = runs.locate(a.attempt)
        groups.setdefault(owner.number if owner is not None else 0, []).append(a)
    return [groups[k] for k in sorted(groups)]


def _between_runs(
    badput: dict[str, float],
    by_run: list[list[Attempt]],
    *,
    checkpoints: list[CheckpointSave],
    hangs: list[Hang],
) -> dict[str, float]:
    """Move the downtime between runs out of ``disruption_recovery`` into ``between_runs``.

    The job-wide accounting counts every gap between attempts (less hang and checkpoint
    time) as disruption; the gaps inside a run are what accounting each run alone counts
    as disruption, so the difference is the gaps between runs. (Accounting the runs again
    keeps the definition of a gap in ``detectors.goodput``, not repeated here.)"""
    inside = 0.0
    for group in by_run:
        if len(group) > 1:  # one attempt: no gap inside the run
            last = max(float(np.max(a.ends)) for a in group)
            inside += account(group, end=last, checkpoints=checkpoints, hangs=hangs).badput[
                "disruption_recovery"
            ]
    between = max(0.0, badput["disruption_recovery"] - inside) if len(by_run) > 1 else 0.0
    out: dict[str, float] = {}
    for key, seconds in badput.items():  # between_runs right after disruption_recovery
        out[key] = seconds - between if key == "disruption_recovery" else seconds
        if key == "disruption_recovery":
            out["between_runs"] = between
    return out


def load_timeline(
    *, session: Session, job_id: int, now: float, run: Run | None = None
) -> np.ndarray[Any, Any]:
    """Rows ``(attempt, step, end_ts, duration_s, data_s)`` of the lowest reporting rank
    (of ``run`` only, when given), ordered by attempt and end time; an empty ``(0, 5)``
    array without steps."""
    where = [StepRecord.job_id == job_id]
    if run is not None:
        where += [
            StepRecord.attempt >= run.first_attempt,
            StepRecord.attempt < run.first_attempt + ATTEMPTS_PER_RUN,
        ]
    rank = session.scalar(select(func.min(StepRecord.rank)).where(*where))
    if rank is None:
        return np.empty((0, 5))
    ts = func.max(StepRecord.ts)
    rows = session.execute(
        select(
            StepRecord.attempt,
            StepRecord.step,
            ts,
            func.max(StepRecord.duration_s),
            func.max(func.coalesce(StepRecord.data_s, 0.0)),
        )
        .where(*where, StepRecord.rank == rank, StepRecord.ts <= now)
        .group_by(StepRecord.attempt, StepRecord.step)
        .order_by(StepRecord.attempt, ts)
    ).all()
    # Plain tuples first: numpy reading SQLAlchemy Row objects one by one is ~4x slower.
    return np.array([tuple(r) for r in rows], dtype=np.float64).reshape(-1, 5)


def load_saves(*, session: Session, job_id: int, now: float) -> list[CheckpointSave]:
    """The ``checkpoint_saved`` events of the lowest rank that sent any, up to ``now``."""
    where = (JobEvent.job_id == job_id, JobEvent.name == SAVE_EVENT)
    rank = session.scalar(select(func.min(JobEvent.rank)).where(*where))
    if rank is None:
        return []
    rows = session.execute(
        select(JobEvent.step, JobEvent.ts, JobEvent.attrs)
        .where(*where, JobEvent.rank == rank)
        .where((JobEvent.ts <= now) | JobEvent.ts.is_(None))
    ).all()
    return [
        CheckpointSave(
            ts=ts,
            step=step if step is not None else _number(attrs, "step", int),
            duration_s=_number(attrs, "duration_s", float),
        )
        for step, ts, attrs in rows
    ]


def _number(attrs: Any, key: str, kind: type[int] | type[float]) -> Any:
    value = attrs.get(key) if isinstance(attrs, dict) else None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return kind(value) if np.isfinite(value) else None


def _attempts(timeline: np.ndarray[Any, Any]) -> list[Attempt]:
    out = []
    for number in np.unique(timeline[:, 0]):
        rows = timeline[timeline[:, 0] == number]
        out.append(
            Attempt(
                attempt=int(number),
                steps=rows[:, 1].astype(np.int64),
                ends=rows[:, 2],
                durations=rows[:, 3],
                data_s=rows[:, 4],
            )
        )
    return out


def _window_end(session: Session, job_id: int, now: float, timeline: np.ndarray[Any, Any]) -> float:
    beat, step = session.execute(
        select(func.max(Rank.last_heartbeat_ts), func.max(Rank.last_step_ts)).where(
            Rank.job_id == job_id
        )
    ).one()
    seen = [v for v in (beat, step) if v is not None]
    if timeline.size:
        seen.append(float(timeline[:, 2].max()))
    return min(max(seen), now) if seen else now


def _incident_intervals(
    session: Session,
    job_id: int,
    *,
    now: float,
    end: float,
    timeline: np.ndarray[Any, Any],
    run: Run | None = None,
) -> dict[str, Any]:
    """Hang and straggler intervals from incidents detected by ``now`` (of ``run`` only,
    when given). A hang detected off the timeline (before its first step or after the
    window ``end``) starts right after the step before its stuck ``first_step``."""
    hangs: list[Hang] = []
    stragglers: list[Straggler] = []
    if not timeline.size:
        return {"hangs": hangs, "stragglers": stragglers}
    query = select(Incident).where(
        Incident.job_id == job_id,
        Incident.kind.in_(("hang", "straggler")),
        Incident.detected_at <= datetime.fromtimestamp(now, UTC),
    )
    if run is not None:  # an incident's fingerprint names its run
        query = query.where(
            Incident.fingerprint.startswith(fingerprint(job_id, "", run.number), autoescape=True)
        )
    rows = session.scalars(query).all()
    lo = float((timeline[:, 2] - timeline[:, 3]).min())
    for row in rows:
        detected = row.detected_at.timestamp()
        resolved = row.resolved_at.timestamp() if row.resolved_at is not None else None
        if resolved is not None and resolved > now:
            resolved = None  # as of ``now`` it was still open
        if row.kind == "hang":
            start = _hang_start(timeline, row.first_step, detected, lo=lo, end=end)
            if start is not None:
                hangs.append(Hang(start=start, end=resolved))
            continue
        onset = None
        if row.first_step is not None:
            onset = _last_end(timeline, row.first_step, detected, start=True)
        last = (row.evidence or {}).get("last_step") if resolved is not None else None
        stragglers.append(
            Straggler(
                start=onset if onset is not None else detected,
                end=resolved,
                first_step=row.first_step,
                last_step=last if isinstance(last, int) else None,
            )
        )
    return {"hangs": hangs, "stragglers": stragglers}


def _hang_start(
    timeline: np.ndarray[Any, Any],
    first_step: int | None,
    detected: float,
    *,
    lo: float,
    end: float,
) -> float | None:
    if lo <= detected <= end:
        return detected
    # Off the timeline (imported data, clock skew): right after the step before the stuck one.
    before = None if first_step is None else _last_end(timeline, first_step - 1, None)
    if before is not None:
        return before + 1e-6
    return end if detected >= lo else None


def _last_end(
    timeline: np.ndarray[Any, Any], step: int, before: float | None, *, start: bool = False
) -> float | None:
    """End (or start) time of the last execution of ``step`` that ended by ``before``
    (any execution if none did)."""
    rows = timeline[timeline[:, 1] == step]
    if not rows.size:
        return None
    if before is not None and (rows[:, 2] <= before).any():
        rows = rows[rows[:, 2] <= before]
    row = rows[np.argmax(rows[:, 2])]
    return float(row[2] - row[3]) if start else float(row[2])
