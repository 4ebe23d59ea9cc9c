"""What the cost model needs to know about a job, read from its telemetry.

timing = job_timing(session=session, job_id=7, attempt=0)
timing.step_s, timing.since_checkpoint_s, timing.note
timing.remaining_s, timing.plan_note    # None, "" unless the run said how long it is

A run says how many steps it plans with ``vigil.init(total_steps=N)`` (or
``VIGIL_TOTAL_STEPS``): every rank's collector sends a ``run_plan`` event once. The cost
model then weighs what is left of the run (remaining steps × median step time) instead of
an assumed horizon.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from backend.telemetry.models import JobEvent, StepRecord

RECENT_STEPS = 50
CHECKPOINT_EVENT = "checkpoint_saved"
PLAN_EVENT = "run_plan"  # attrs: {"total_steps": N}


@dataclass(frozen=True)
class Timing:
    step_s: float | None  # median recent step time (slowest rank per step)
    since_checkpoint_s: float  # work a restart would redo
    checkpoint_step: int | None
    last_step: int | None
    note: str  # how since_checkpoint_s was estimated
    remaining_s: float | None = None  # what is left of the run's planned steps, if known
    plan_note: str = ""  # how remaining_s was worked out


def _recent_steps(session: Session, job_id: int, attempt: int | None) -> list[tuple[int, float]]:
    query = select(StepRecord.step, func.max(StepRecord.duration_s)).where(
        StepRecord.job_id == job_id
    )
    if attempt is not None:
        query = query.where(StepRecord.attempt == attempt)
    query = query.group_by(StepRecord.step).order_by(StepRecord.step.desc()).limit(RECENT_STEPS)
    return [(int(s), float(d)) for s, d in session.execute(query) if d is not None]


def job_timing(
    *, session: Session, job_id: int, attempt: int, before_step: int | None = None
) -> Timing:
    """Median step time and the work since the last ``checkpoint_saved`` event.

    Work is counted in steps times the median step time, so a restart's downtime does not
    count as work. ``before_step`` asks for the last checkpoint before that step (a
    rollback must go back past the first bad step). Without any checkpoint event, all the
    work since the job's first step is taken as at risk.
    """
    rows = _recent_steps(session, job_id, attempt) or _recent_steps(session, job_id, None)
    durations = [d for _, d in rows if math.isfinite(d) and d >= 0]
    step_s = statistics.median(durations) if durations else None
    if not rows or step_s is None:
        return Timing(step_s, 0.0, None, None, "no steps recorded: no work at risk")
    last_step = rows[0][0]
    query = select(JobEvent.step).where(
        JobEvent.job_id == job_id, JobEvent.name == CHECKPOINT_EVENT, JobEvent.step.is_not(None)
    )
    if before_step is not None:
        query = query.where(JobEvent.step < before_step)
    checkpoint = session.scalar(query.order_by(JobEvent.step.desc()).limit(1))
    if checkpoint is not None:
        steps = max(0, last_step - int(checkpoint))
        note = f"{steps} steps since the checkpoint at step {checkpoint}"
    else:
        first = session.scalar(select(func.min(StepRecord.step)).where(StepRecord.job_id == job_id))
        steps = max(0, last_step - int(first if first is not None else last_step))
        note = f"no {CHECKPOINT_EVENT} event seen: all {steps} steps since the first are at risk"
    total = planned_steps(session=session, job_id=job_id)
    remaining_s, plan_note = None, ""
    if total is not None:
        left = max(0, total - 1 - last_step)
        remaining_s = left * step_s
        plan_note = (
            f"{left} of the {total} planned steps to go after step {last_step}, "
            f"at {step_s:.3g} s a step"
        )
    return Timing(
        step_s=step_s,
        since_checkpoint_s=steps * step_s,
        checkpoint_step=int(checkpoint) if checkpoint is not None else None,
        last_step=last_step,
        note=note,
        remaining_s=remaining_s,
        plan_note=plan_note,
    )


def planned_steps(*, session: Session, job_id: int) -> int | None:
    """The step count the job's latest ``run_plan`` event gives, if any (a positive int)."""
    attrs = session.scalar(
        select(JobEvent.attrs)
        .where(JobEvent.job_id == job_id, JobEvent.name == PLAN_EVENT)
        .order_by(JobEvent.id.desc())
        .limit(1)
    )
    total = attrs.get("total_steps") if isinstance(attrs, dict) else None
    if isinstance(total, bool) or not isinstance(total, int) or total <= 0:
        return None
    return total
