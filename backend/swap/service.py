"""Activation-swap policies of a job: make (or reuse) one for an op sequence, and follow
what the job's steps say about it.

    out = policy_for(session=session, job_id=7, opseq="9f2c…", reason="opseq_change")
    out.policy   # a SwapPolicy row, new or reused; None while it cannot be made (out.why)
    observe_steps(session=session, job_id=7)   # applied / superseded, measured peaks

**Budget**: the smallest ``mem_capacity`` among the job's live ranks that run the swap
executor (``swap_capable``, not exited, of the job's current attempt), less ``margin`` of
it. The first policy for a sequence holds back ``INITIAL_MARGIN`` (5%): the memory detector
fires at 95% of capacity (``detectors.memory.MemoryConfig.usage_frac``), so a policy that
fits its budget also clears the ``memory_pressure`` incident that asked for it. A policy
whose step measured more than its budget is made again with ``MARGIN_STEP`` more margin,
at most up to ``MAX_MARGIN`` (``backend.swap.loop``).

**Cache**: a policy is reused, not made again, for the same (job, op sequence, budget,
margin, bandwidth): a job that alternates between sequence-length buckets keeps one policy
per bucket and no new version. A new policy gets the job's next version (from 1) and is
made by ``detectors.swap.generate`` from the op sequence's profile (``opseqs.profile``),
inline: well under a second even for 10,000 ops (``bench/swap_policy.py``), so the
detection run (embedded ticker or Celery worker alike) does it without a task of its own.

**States** (``set_state`` is the one place they change): ``proposed`` (made; sent or not)
→ ``applied`` (steps report running it) → ``superseded`` (steps report another one; back
to ``applied`` if the job returns to it); ``proposed`` → ``failed`` when the action that
carried it failed. ``observe_steps`` reads the steps of the detection window only (not the
ingest path): the first step that reported a version, and the highest ``swap_peak_bytes``
seen for it, folded in run after run.

Services only flush; the caller commits.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from backend.actions.models import Action
from backend.jobs.models import Job, Rank
from backend.settings import Settings
from backend.swap.models import ShapeFingerprint, SwapPolicy
from backend.telemetry.models import OpSequence, StepRecord
from detectors.memory import MemoryConfig
from detectors.swap import generate

__all__ = [
    "INITIAL_MARGIN",
    "MARGIN_STEP",
    "MAX_MARGIN",
    "PolicyOutcome",
    "bandwidth",
    "live_swap_ranks",
    "observe_steps",
    "opseq_of_shape",
    "policy_for",
    "set_state",
]

log = logging.getLogger(__name__)

INITIAL_MARGIN = round(1.0 - MemoryConfig().usage_frac, 2)  # 0.05
MARGIN_STEP = 0.1
MAX_MARGIN = round(INITIAL_MARGIN + 3 * MARGIN_STEP, 2)  # three regenerations at most


@dataclass(frozen=True)
class PolicyOutcome:
    """A policy (``created``: made by this call, else reused), or None and ``why`` not."""

    policy: SwapPolicy | None
    created: bool = False
    why: str = ""


def bandwidth(settings: Settings | None) -> float:
    """Host↔device bandwidth the generator assumes: the setting, else its default."""
    if settings is not None:
        return float(settings.swap_bandwidth_bytes_per_s)
    return float(Settings.model_fields["swap_bandwidth_bytes_per_s"].default)


def live_swap_ranks(*, session: Session, job_id: int) -> list[Rank]:
    """The job's ranks that can apply a policy now: running the swap executor, not exited,
    of the job's current restart attempt; by rank."""
    attempt = select(Job.attempt).where(Job.id == job_id).scalar_subquery()
    query = (
        select(Rank)
        .where(
            Rank.job_id == job_id,
            Rank.swap_capable.is_(True),
            Rank.exited.is_(False),
            Rank.attempt >= attempt,
        )
        .order_by(Rank.rank)
    )
    return list(session.scalars(query))


def _capacity(ranks: list[Rank]) -> int | None:
    known = [r.mem_capacity for r in ranks if r.mem_capacity is not None and r.mem_capacity > 0]
    return min(known) if known else None


def budget_bytes(capacity: int, margin: float) -> int:
    """The device memory a policy may use: ``capacity`` less ``margin`` of it."""
    return int(capacity * (1.0 - margin))


def opseq_of_shape(*, session: Session, job_id: int, shape_fp: str) -> str | None:
    """The op-sequence fingerprint a captured step with ``shape_fp`` reported, if any."""
    return session.scalar(
        select(ShapeFingerprint.opseq).where(
            ShapeFingerprint.job_id == job_id, ShapeFingerprint.shape_fp == shape_fp
        )
    )


def policy_for(
    *,
    session: Session,
    job_id: int,
    opseq: str,
    reason: str,
    incident_id: int | None = None,
    margin: float | None = None,
    settings: Settings | None = None,
) -> PolicyOutcome:
    """The policy for ``opseq`` under the job's current budget: reused when one was made
    for the same inputs, else generated and stored as the job's next version. None (with
    ``why``) while no live rank runs the swap executor, none reported its capacity, or the
    sequence has no profile yet: callers try again on the next detection run.

    ``margin`` (of the capacity held back) defaults to the largest one this sequence
    needed so far (over-budget corrections raise it), else ``INITIAL_MARGIN``."""
    ranks = live_swap_ranks(session=session, job_id=job_id)
    if not ranks:
        return PolicyOutcome(None, why="no live rank runs the swap executor")
    capacity = _capacity(ranks)
    if capacity is None:
        return PolicyOutcome(None, why="no swap-capable rank reported its memory capacity")
    margin = round(_learned_margin(session, job_id, opseq) if margin is None else margin, 2)
    budget, bw = budget_bytes(capacity, margin), bandwidth(settings)
    cached = session.scalar(
        select(SwapPolicy)
        .where(
            SwapPolicy.job_id == job_id,
            SwapPolicy.opseq == opseq,
            SwapPolicy.budget_bytes == budget,
            SwapPolicy.margin == margin,
            SwapPolicy.bandwidth_bytes_per_s == bw,
        )
        .order_by(SwapPolicy.version.desc())
        .limit(1)
    )
    if cached is not None:
        return PolicyOutcome(cached)
    profile = session.scalar(
        select(OpSequence.profile).where(OpSequence.job_id == job_id, OpSequence.hash == opseq)
    )
    if not profile:
        return PolicyOutcome(None, why=f"op sequence {opseq[:12]} has no profile yet")
    version = 1 + (
        session.scalar(select(func.max(SwapPolicy.version)).where(SwapPolicy.job_id == job_id)) or 0
    )
    try:
        made = generate(profile, budget_bytes=budget, bandwidth_bytes_per_s=bw, version=version)
    except ValueError as exc:  # a stored profile the generator refuses: say which field
        return PolicyOutcome(
            None, why=f"the profile of op sequence {opseq[:12]} is unusable: {exc}"
        )
    row = _store(job_id, opseq, reason, incident_id, margin, made)
    session.add(row)
    session.flush()
    log.info(
        "swap: policy v%s for job %s, op sequence %s: budget %s B, predicted peak %s B, "
        "%d offloaded%s",
        version,
        job_id,
        opseq[:12],
        budget,
        row.predicted_peak_bytes,
        len(made["offload"]),
        "" if row.feasible else " (does not fit)",
    )
    return PolicyOutcome(row, created=True)


def _learned_margin(session: Session, job_id: int, opseq: str) -> float:
    most = session.scalar(
        select(func.max(SwapPolicy.margin)).where(
            SwapPolicy.job_id == job_id, SwapPolicy.opseq == opseq
        )
    )
    return INITIAL_MARGIN if most is None else max(INITIAL_MARGIN, float(most))


def _store(
    job_id: int,
    opseq: str,
    reason: str,
    incident_id: int | None,
    margin: float,
    made: dict[str, Any],
) -> SwapPolicy:
    return SwapPolicy(
        job_id=job_id,
        version=made["version"],
        opseq=opseq,
        budget_bytes=made["budget_bytes"],
        bandwidth_bytes_per_s=made["bandwidth_bytes_per_s"],
        margin=margin,
        reason=reason,
        state="proposed",
        policy=made,
        predicted_peak_bytes=int(made["predicted_peak_bytes"]),
        predicted_exposed_s=float(made["predicted_exposed_s"]),
        feasible=bool(made["feasible"]),
        incident_id=incident_id,
    )


def set_state(row: SwapPolicy, to: str) -> bool:
    """Move ``row`` to state ``to`` (True if it moved); an illegal move raises ValueError."""
    return row.move_to(to)


def observe_steps(*, session: Session, job_id: int, width: int = 200) -> SwapPolicy | None:
    """Fold the recent steps' reports into the job's policies; returns the active one.

    Reads the steps among the last ``width`` of the job's current attempt that carry
    ``swap_policy``: per version, the first step and the highest measured peak. The
    version the latest of them ran is ``applied``; any other applied one is
    ``superseded``. A proposed policy whose action failed is ``failed``.
    """
    _mark_failed(session, job_id)
    attempt = session.scalar(select(Job.attempt).where(Job.id == job_id)) or 0
    current = (StepRecord.job_id == job_id, StepRecord.attempt == attempt)
    last = session.scalar(select(func.max(StepRecord.step)).where(*current))
    if last is None:
        return _active(session, job_id)
    seen = session.execute(
        select(
            StepRecord.swap_policy,
            func.min(StepRecord.step),
            func.max(StepRecord.step),
            func.max(StepRecord.swap_peak_bytes),
        )
        .where(*current, StepRecord.step >= last - width, StepRecord.swap_policy.is_not(None))
        .group_by(StepRecord.swap_policy)
    ).all()
    if not seen:
        return _active(session, job_id)
    rows = {
        r.version: r
        for r in session.scalars(
            select(SwapPolicy).where(
                SwapPolicy.job_id == job_id, SwapPolicy.version.in_([s[0] for s in seen])
            )
        )
    }
    latest: tuple[int, int] | None = None  # (last step, version) of the newest report
    for version, first, until, peak in seen:
        row = rows.get(version) if version is not None else None
        if row is None:  # a version this backend never made (another deployment?)
            log.debug("swap: job %s steps report unknown policy v%s", job_id, version)
            continue
        row.applied_step = first if row.applied_step is None else min(row.applied_step, first)
        if peak is not None:
            row.measured_peak_bytes = max(row.measured_peak_bytes or 0, int(peak))
        if latest is None or (until, row.version) > latest:
            latest = (until, row.version)
    if latest is not None:
        _activate(session, job_id, rows[latest[1]], list(rows.values()))
    session.flush()
    return _active(session, job_id)


def _activate(session: Session, job_id: int, active: SwapPolicy, seen: list[SwapPolicy]) -> None:
    """``active`` is applied; every other policy that was applied, or that steps ran but
    that never became the active one, is superseded."""
    applied = session.scalars(
        select(SwapPolicy).where(SwapPolicy.job_id == job_id, SwapPolicy.state == "applied")
    )
    for row in {*applied, *seen}:
        if row is not active and row.state in ("applied", "proposed"):
            set_state(row, "superseded")
    set_state(active, "applied")


def _active(session: Session, job_id: int) -> SwapPolicy | None:
    return session.scalar(
        select(SwapPolicy)
        .where(SwapPolicy.job_id == job_id, SwapPolicy.state == "applied")
        .order_by(SwapPolicy.version.desc())
        .limit(1)
    )


def _mark_failed(session: Session, job_id: int) -> None:
    """Proposed policies whose action failed (a rank could not apply it) are failed."""
    failed = session.scalars(
        select(SwapPolicy)
        .join(Action, Action.id == SwapPolicy.action_id)
        .where(
            SwapPolicy.job_id == job_id,
            SwapPolicy.state == "proposed",
            Action.state == "failed",
        )
    )
    for row in failed:
        set_state(row, "failed")
    session.flush()
