"""Recovery: from freshly opened incidents to actions, with guards, approvals and an audit.

    # in the detection run, in the same transaction that opened the incidents:
    changes = detect_job(session=session, job_id=job_id)
    actions = respond(session=session, incidents=changes.opened, settings=settings)

    approve(session=session, action_id=12, actor="api:oncall")   # proposed → pending
    cancel(session=session, action_id=12, actor="api:oncall")    # any open state → cancelled
    expire_actions(session=session)                               # periodic sweep

``cancel`` and ``expire_actions`` live in ``backend.actions.service`` (they are the action's
own life cycle) and are re-exported here; ``approve`` lives here because it re-checks the
guards. Every state change goes through ``backend.actions.states.transition``.

For each incident ``respond`` resolves the job's policy (``backend.recovery.policies``):
``off`` does nothing (audited as ``skipped``); otherwise the cost model
(``detectors.policy``) picks an action from facts read here, the guards
(``backend.recovery.guards``) may block it, and the action is created ``pending`` (mode
``auto``) or ``proposed`` (mode ``approve``: no rank sees it until it is approved). An
incident gets at most one action, ever (idempotency key ``incident:<id>:<kind>``).

A blocked action is not stored as an action: the ``blocked`` audit entry holds the choice,
its cost table and the guard that stopped it. Every step is audited (actor ``policy``).
Services only flush; the caller commits. Errors are ``backend.errors`` ones: ``NotFound``,
``Conflict`` and its subclass ``GuardBlocked`` (importable from here too).
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from backend.actions.models import Action
from backend.actions.service import (
    DEFAULT_TTL_S,
    cancel,
    create_action,
    expire_actions,
    expire_for,
    job_attempt,
    lock_action,
)
from backend.actions.states import transition
from backend.audit.service import audit, list_audit
from backend.db import utcnow
from backend.errors import Conflict, NotFound
from backend.incidents.models import INCIDENT_KINDS, Incident
from backend.jobs.models import Job
from backend.jobs.runs import require_live, run_over
from backend.recovery.facts import job_timing
from backend.recovery.guards import GuardResult, check_guards
from backend.recovery.policies import (
    EffectivePolicy,
    PolicyError,
    effective_policy,
    list_policies,
    put_policy,
)
from backend.settings import Settings
from detectors.policy import decide, facts_dict, facts_from_incident

__all__ = [
    "Conflict",
    "GuardBlocked",
    "NotFound",
    "PolicyError",
    "approve",
    "cancel",
    "effective_policy",
    "expire_actions",
    "list_audit",
    "list_policies",
    "put_policy",
    "respond",
    "retire",
    "withdraw",
]

log = logging.getLogger(__name__)

POLICY_ACTOR = "policy"
DEFAULT_APPROVE_TTL_S = 3600.0


class GuardBlocked(Conflict):
    """A guard (cooldown, hourly cap) refuses an approval; ``guards`` holds every check."""

    def __init__(self, message: str, guards: list[GuardResult]) -> None:
        super().__init__(message, extra={"guards": [g.to_dict() for g in guards]})
        self.guards = guards


def respond(
    *,
    session: Session,
    incidents: list[Incident],
    settings: Settings | None = None,
    now: datetime | None = None,
) -> list[Action]:
    """Act on freshly opened incidents per their policies. Returns the actions *this call*
    created (pending or proposed); a second call for the same incident creates nothing."""
    now = now or utcnow()
    created = []
    for incident in incidents:
        action = _respond_one(session=session, incident=incident, settings=settings, now=now)
        if action is not None:
            created.append(action)
    return created


def withdraw(
    *, session: Session, incident: Incident, reason: str, now: datetime | None = None
) -> list[Action]:
    """Cancel the incident's actions that no rank has received yet (proposed or pending),
    e.g. when it turns out to be the consequence of another incident, whose own action is
    the one to take. Audited as a cancellation by ``policy`` with ``reason``."""
    now = now or utcnow()
    waiting = session.scalars(
        select(Action).where(
            Action.incident_id == incident.id, Action.state.in_(("proposed", "pending"))
        )
    ).all()
    for action in waiting:
        cancel(session=session, action_id=action.id, actor=POLICY_ACTOR, note=reason, now=now)
    return list(waiting)


# Kinds whose waiting proposals are moot once the incident resolves: the condition went
# away. A diverged model (nan, loss_spike) still needs its rollback, and a new op sequence
# its swap policy, after the incident itself is over.
MOOT_WHEN_RESOLVED = frozenset(INCIDENT_KINDS) - {"nan", "loss_spike", "opseq_change"}


def retire(
    *, session: Session, incidents: list[Incident], now: datetime | None = None
) -> list[Action]:
    """Expire the proposals nobody approved of incidents that resolved (of the kinds in
    ``MOOT_WHEN_RESOLVED``), so no page offers to approve a restart for a straggler that
    is no longer slow. ``result.expired_because`` and the audit entry say why."""
    now = now or utcnow()
    ids = [i.id for i in incidents if i.status == "resolved" and i.kind in MOOT_WHEN_RESOLVED]
    if not ids:
        return []
    proposals = list(
        session.scalars(
            select(Action)
            .where(Action.incident_id.in_(ids), Action.state == "proposed")
            .order_by(Action.id)
            .with_for_update()
        )
    )
    for action in proposals:
        reason = f"incident {action.incident_id} resolved before anyone approved this"
        expire_for(session=session, action=action, reason=reason, now=now)
    return proposals


def _respond_one(
    *, session: Session, incident: Incident, settings: Settings | None, now: datetime
) -> Action | None:
    job = session.get(Job, incident.job_id)
    if job is None:
        return None
    policy = effective_policy(session=session, job=job.name, kind=incident.kind)

    def note(event: str, action_id: int | None = None, **detail: object) -> None:
        audit(
            session=session,
            job_id=job.id,
            actor=POLICY_ACTOR,
            event=event,
            action_id=action_id,
            incident_id=incident.id,
            detail={"incident_kind": incident.kind, "policy": policy.to_dict(), **detail},
            at=now,
        )

    if policy.mode == "off":
        note("skipped", reason=f"the policy ({policy.source}) is off for {incident.kind}")
        return None
    if run_over(session=session, job_id=job.id):  # found in an ended run's last data
        note("skipped", reason="the job's run has ended: no process is left to act on")
        return None
    existing = session.scalar(
        select(Action).where(Action.incident_id == incident.id).order_by(Action.id).limit(1)
    )
    if existing is not None:
        note(
            "skipped",
            action_id=existing.id,
            reason=f"incident {incident.id} already has action {existing.id} ({existing.kind})",
        )
        return None
    timing = job_timing(
        session=session,
        job_id=job.id,
        attempt=job.attempt,
        before_step=incident.first_step if incident.kind in ("nan", "loss_spike") else None,
    )
    try:
        facts = facts_from_incident(
            kind=incident.kind,
            ranks=tuple(incident.ranks or ()),
            active=incident.status == "open",
            evidence=incident.evidence or {},
            params=policy.params,
            step_s=timing.step_s,
            since_checkpoint_s=timing.since_checkpoint_s,
            world_size=job.world_size,
            allowed=policy.actions,
            first_step=incident.first_step,
            remaining_s=timing.remaining_s,
            plan_note=timing.plan_note,
        )
        decision = decide(facts)
    except (TypeError, ValueError) as exc:  # a bad stored param must not break detection
        log.warning("recovery: cannot decide on incident %s", incident.id, exc_info=True)
        note("error", reason=f"{type(exc).__name__}: {exc}")
        return None
    reasoning = {
        **decision.to_dict(),
        "facts": facts_dict(facts),
        "work_at_risk": timing.note,
        "incident": {"id": incident.id, "kind": incident.kind, "summary": incident.summary},
        "policy": policy.to_dict(),
    }
    if decision.action is None:
        note("no_action", reasoning=reasoning)
        return None
    guards = check_guards(
        session=session,
        job_id=job.id,
        kind=decision.action,
        params=policy.params,
        settings=settings,
        now=now,
    )
    reasoning["guards"] = [g.to_dict() for g in guards]
    blocked = [g for g in guards if not g.ok]
    if blocked:
        note(
            "blocked",
            action=decision.action,
            guard=blocked[0].guard,
            message=blocked[0].detail,
            reasoning=reasoning,
        )
        return None
    auto = policy.mode == "auto"
    ttl = float(
        policy.params.get("ttl_s", DEFAULT_TTL_S)
        if auto
        else policy.params.get("approve_ttl_s", DEFAULT_APPROVE_TTL_S)
    )
    action, created = create_action(
        session=session,
        job_id=job.id,
        kind=decision.action,
        requested_by=POLICY_ACTOR,
        target_ranks=list(decision.target_ranks) if decision.target_ranks is not None else None,
        params=decision.params,
        reason=decision.explanation[:2000],
        idempotency_key=f"incident:{incident.id}:{decision.action}",
        ttl_s=ttl,
        incident_id=incident.id,
        state="pending" if auto else "proposed",
        reasoning=reasoning,
    )
    return action if created else None


def _policy_for(session: Session, action: Action) -> EffectivePolicy:
    job = session.get(Job, action.job_id)
    incident = session.get(Incident, action.incident_id) if action.incident_id else None
    kind = incident.kind if incident is not None else "*"
    return effective_policy(session=session, job=job.name if job else "*", kind=kind)


def approve(
    *,
    session: Session,
    action_id: int,
    actor: str,
    settings: Settings | None = None,
    force: bool = False,
    note: str = "",
    job_id: int | None = None,
    now: datetime | None = None,
) -> Action:
    """Release a proposed action to ranks (→ ``pending``), after checking the guards again.

    Raises ``NotFound`` (no such action, or not in ``job_id``), ``Conflict`` (not proposed,
    or its proposal expired) or ``GuardBlocked`` (a guard blocks it and ``force`` is false;
    the refusal is audited, so commit before reporting it).
    """
    now = now or utcnow()
    action = lock_action(session=session, action_id=action_id, job_id=job_id)
    if action.state != "proposed":
        raise Conflict(
            f"action {action_id} is {action.state}: only a proposed action can be approved"
        )
    if action.expires_at is not None and action.expires_at < now:
        raise Conflict(f"action {action_id}'s proposal expired at {action.expires_at.isoformat()}")
    # Nobody to run it (its run ended, no rank reports): refused, not left pending forever.
    require_live(session=session, job_id=action.job_id, now=now, attempt=action.attempt)
    policy = _policy_for(session, action)
    guards = check_guards(
        session=session,
        job_id=action.job_id,
        kind=action.kind,
        params=policy.params,
        settings=settings,
        now=now,
        exclude_action_id=action.id,
    )
    blocked = [g for g in guards if not g.ok]
    detail = {"kind": action.kind, "guards": [g.to_dict() for g in guards], "note": note}
    if blocked and not force:
        audit(
            session=session,
            job_id=action.job_id,
            actor=actor,
            event="blocked",
            action_id=action.id,
            incident_id=action.incident_id,
            detail={**detail, "guard": blocked[0].guard, "message": blocked[0].detail},
            at=now,
        )
        raise GuardBlocked(
            f"action {action_id} not approved: {blocked[0].guard}: {blocked[0].detail} "
            "(approve with force to override)",
            guards,
        )
    transition(  # proposed → pending is audited as "approved"
        session=session,
        action=action,
        to="pending",
        actor=actor,
        now=now,
        guards=detail["guards"],
        note=note,
        forced=bool(blocked),
    )
    action.approved_by = actor[:128]
    # Approved now: it is for the job as it runs now, not as it ran when proposed.
    action.attempt = job_attempt(session=session, job_id=action.job_id)
    action.expires_at = now + timedelta(seconds=float(policy.params.get("ttl_s", DEFAULT_TTL_S)))
    approval = {"by": actor, "at": now.isoformat(), "forced": bool(blocked), **detail}
    action.reasoning = {**(action.reasoning or {}), "approval": approval}
    session.flush()
    return action
