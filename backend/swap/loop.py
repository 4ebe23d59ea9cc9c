"""The swap loop: after each detection run, turn op-sequence drift and memory pressure into
an activation-swap policy in the running job, and correct it from what the job measures.

    # backend.detection.tasks.run_detection, in the detection run's transaction, after
    # the incidents' follow-up (alerts, recovery):
    swap_follow_up(session=session, job_id=job_id, settings=settings)

For a job with live ranks that run the swap executor (``ranks.swap_capable``), each run:

1. **compare**: the steps' reports (policy version, measured peak) mark policies applied or
   superseded (``backend.swap.service.observe_steps``);
2. **drift and pressure**: for each open ``opseq_change`` incident (the new shape is its
   evidence ``to_shape_fp``; its op sequence the evidence ``to_opseq``, else the one a
   captured step of that shape reported since: ``shape_fingerprints.opseq``) and each
   open ``memory_pressure`` incident (the shape the job's latest step ran), the policy
   for that op sequence is made or reused and sent to the live swap-capable ranks as an
   ``apply_swap_policy`` action with params
   ``{"policy": POLICY, "shape_fp": …}``. Not while the job's steps already run that
   version, nor while an action carrying it is open or done in the job's current restart
   attempt (a restarted group has not received it). While the policy cannot be made yet
   (no profile, no capacity), nothing is sent and the next run tries again;
3. **over budget**: when the active policy's measured peak exceeds its budget, it is made
   again for the same op sequence with ``MARGIN_STEP`` more margin (reason
   ``over_budget``, up to ``MAX_MARGIN``) and sent. A policy that was predicted not to fit
   is not retried: more margin cannot help it.

Every action goes through the recovery policy of its incident's kind, with the guards and
the audit (``backend.swap.push``; the built-in default for it is ``auto``).

The swap action sits beside the incident's recovery action rather than competing with it in
the cost model (``detectors.policy`` lists it as a candidate and says so): it lowers the
peak for the sequence the job runs now; a ``checkpoint_now`` for the same memory pressure
still guards the work. Generation is inline (well under a second), in the embedded ticker
and the Celery worker alike; a failure here is logged and leaves the run's incidents,
alerts and recovery actions committed (``swap_follow_up`` uses a savepoint).
"""

from __future__ import annotations

import logging
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from backend.actions.models import Action
from backend.db import utcnow
from backend.incidents.models import Incident
from backend.jobs.models import Job, Rank
from backend.settings import Settings
from backend.swap.models import ShapeFingerprint, SwapPolicy
from backend.swap.push import push, sent
from backend.swap.service import (
    MARGIN_STEP,
    MAX_MARGIN,
    live_swap_ranks,
    observe_steps,
    opseq_of_shape,
    policy_for,
)
from backend.telemetry.models import StepRecord

__all__ = ["SWAP_KINDS", "run_swap_loop", "swap_follow_up"]

log = logging.getLogger(__name__)

SWAP_KINDS = ("opseq_change", "memory_pressure")


def swap_follow_up(*, session: Session, job_id: int, settings: Settings | None) -> list[Action]:
    """:func:`run_swap_loop` in a savepoint: an error is logged and undoes only its own
    writes, never the detection run's."""
    try:
        with session.begin_nested():
            return run_swap_loop(session=session, job_id=job_id, settings=settings)
    except Exception:
        log.exception("swap loop failed for job %s; the detection run's results are kept", job_id)
        return []


def run_swap_loop(
    *,
    session: Session,
    job_id: int,
    settings: Settings | None = None,
    now: datetime | None = None,
) -> list[Action]:
    """Compare, act on drift and pressure, correct over-budget policies (module doc).
    Returns the actions created. Two indexed queries for a job that never swapped."""
    ranks = live_swap_ranks(session=session, job_id=job_id)
    if not ranks and not _has_policies(session, job_id):
        return []
    width = settings.detect_window_steps if settings is not None else 200
    active = observe_steps(session=session, job_id=job_id, width=width)
    job = session.get(Job, job_id)
    if not ranks or job is None:
        return []
    now = now or utcnow()
    created = _respond_to_incidents(session, job, ranks, settings, now)
    if active is not None:
        created += _correct_over_budget(session, job, active, ranks, settings, now)
    for action in created:
        log.warning(
            "swap: %s %s for job %s: %s",
            action.kind,
            "proposed" if action.state == "proposed" else "requested",
            job.name,
            action.reason,
        )
    return created


def _has_policies(session: Session, job_id: int) -> bool:
    return (
        session.scalar(select(SwapPolicy.id).where(SwapPolicy.job_id == job_id).limit(1))
        is not None
    )


def _respond_to_incidents(
    session: Session, job: Job, ranks: list[Rank], settings: Settings | None, now: datetime
) -> list[Action]:
    incidents = session.scalars(
        select(Incident)
        .where(
            Incident.job_id == job.id,
            Incident.status == "open",
            Incident.kind.in_(SWAP_KINDS),
        )
        .order_by(Incident.id)
    )
    created = []
    for incident in incidents:
        target = _target(session, job.id, incident)
        if isinstance(target, str):
            log.debug("swap: incident %s waits: %s", incident.id, target)
            continue
        shape_fp, opseq = target
        out = policy_for(
            session=session,
            job_id=job.id,
            opseq=opseq,
            reason=incident.kind,
            incident_id=incident.id,
            settings=settings,
        )
        if out.policy is None:
            log.debug("swap: incident %s waits: %s", incident.id, out.why)
            continue
        if out.policy.state == "applied" or sent(session, job, out.policy.version):
            continue  # the job runs it already, or has it on the way
        action = push(
            session=session,
            job=job,
            row=out.policy,
            shape_fp=shape_fp,
            incident=incident,
            kind=incident.kind,
            ranks=ranks,
            settings=settings,
            now=now,
        )
        if action is not None:
            created.append(action)
    return created


def _target(session: Session, job_id: int, incident: Incident) -> tuple[str, str] | str:
    """``(shape_fp, opseq)`` the incident needs a policy for, or why it is not known yet."""
    evidence = incident.evidence or {}
    if incident.kind == "opseq_change":
        shape_fp = _first_text(evidence, "to_shape_fp", "to")
        if shape_fp is None:
            return "the incident names no new shape fingerprint (evidence 'to_shape_fp')"
        opseq = _first_text(evidence, "to_opseq", "opseq")
    else:
        shape_fp = session.scalar(
            select(StepRecord.shape_fp)
            .where(StepRecord.job_id == job_id, StepRecord.shape_fp.is_not(None))
            .order_by(StepRecord.step.desc())
            .limit(1)
        )
        if shape_fp is None:
            return "the job's steps carry no shape fingerprint"
        opseq = None
    opseq = opseq or opseq_of_shape(session=session, job_id=job_id, shape_fp=shape_fp)
    if not opseq:
        return f"no captured step of shape {shape_fp[:12]} yet: its op sequence is unknown"
    return shape_fp, opseq


def _first_text(evidence: dict[str, object], *keys: str) -> str | None:
    """The first of ``keys`` the evidence holds as a non-empty string."""
    for key in keys:
        value = evidence.get(key)
        if isinstance(value, str) and value:
            return value
    return None


def _correct_over_budget(
    session: Session,
    job: Job,
    active: SwapPolicy,
    ranks: list[Rank],
    settings: Settings | None,
    now: datetime,
) -> list[Action]:
    """The active policy measured more than its budget: make it again with more margin."""
    measured = active.measured_peak_bytes
    if measured is None or measured <= active.budget_bytes or not active.feasible:
        return []
    margin = round(active.margin + MARGIN_STEP, 2)
    if margin > MAX_MARGIN:
        log.info("swap: job %s policy v%s over budget at the margin cap", job.id, active.version)
        return []
    out = policy_for(
        session=session,
        job_id=job.id,
        opseq=active.opseq,
        reason="over_budget",
        incident_id=active.incident_id,
        margin=margin,
        settings=settings,
    )
    if (
        out.policy is None
        or out.policy.state == "applied"
        or sent(session, job, out.policy.version)
    ):
        return []
    incident = session.get(Incident, active.incident_id) if active.incident_id else None
    action = push(
        session=session,
        job=job,
        row=out.policy,
        shape_fp=_shape_of(session, active),
        incident=incident,
        kind=incident.kind if incident is not None else "memory_pressure",
        ranks=ranks,
        settings=settings,
        now=now,
        cause="over_budget",
    )
    return [action] if action is not None else []


def _shape_of(session: Session, row: SwapPolicy) -> str:
    """The shape fingerprint ``row`` was sent for, else the latest one of its sequence."""
    sent = session.get(Action, row.action_id) if row.action_id else None
    shape = (sent.params or {}).get("shape_fp") if sent is not None else None
    if isinstance(shape, str) and shape:
        return shape
    latest = session.scalar(
        select(ShapeFingerprint.shape_fp)
        .where(ShapeFingerprint.job_id == row.job_id, ShapeFingerprint.opseq == row.opseq)
        .order_by(ShapeFingerprint.first_step.desc())
        .limit(1)
    )
    return latest or ""
