"""Recovery actions: create (idempotently), hand out to ranks, record what ranks report.

An action targets some ranks (or all of the job's ranks). Each targeted rank gets it once,
in an ingest reply; its progress is kept per rank in ``deliveries``, and the action's own
state follows: pending → dispatched (first rank got it) → acked (a rank started it) →
succeeded (every targeted rank succeeded) | failed (any rank failed) | expired.

The recovery policy may create an action as ``proposed`` instead: it is never handed to a
rank until someone approves it (``backend.recovery.service.approve``, which checks the
guards). Every state change goes through :func:`backend.actions.states.transition`, which
checks it against the table and writes the audit row; creating an action is audited too.

    action, created = create_action(session=session, job_id=7, kind="dump_stacks",
                                    requested_by="api:oncall", reason="stacks please")
    cancel(session=session, action_id=action.id, actor="api:oncall")  # any open state
    expire_actions(session=session)                                     # periodic sweep
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from backend.actions.models import Action
from backend.actions.states import (
    INITIAL_STATES,
    OPEN_STATES,
    IllegalTransition,
    states_that_can_become,
    transition,
)
from backend.audit.service import audit
from backend.db import utcnow
from backend.errors import Invalid, NotFound
from backend.jobs.models import Job

__all__ = [
    "CANCELLABLE",
    "DEFAULT_TTL_S",
    "EXPIRABLE",
    "OPEN_STATES",
    "cancel",
    "create_action",
    "dispatch_for_rank",
    "expire_actions",
    "expire_for",
    "get_action",
    "job_attempt",
    "jobs_with_open_actions",
    "list_actions",
    "lock_action",
    "record_report",
]

DEFAULT_TTL_S = 600
SYSTEM_ACTOR = "system"
# Kinds whose success ends the process: the next attempt is their outcome.
RESTARTING_KINDS = ("restart", "exit_for_restart", "rollback", "evict_rank")
CANCELLABLE = states_that_can_become("cancelled")  # proposed, pending, dispatched, acked
# What the periodic sweep expires: a proposal nobody approved, an action no rank picked up.
EXPIRABLE = ("proposed", "pending")


def job_attempt(*, session: Session, job_id: int) -> int:
    """The job's current restart attempt (the highest any rank reported)."""
    return session.scalar(select(Job.attempt).where(Job.id == job_id)) or 0


def create_action(
    *,
    session: Session,
    job_id: int,
    kind: str,
    requested_by: str,
    target_ranks: list[int] | None = None,
    params: dict[str, Any] | None = None,
    reason: str = "",
    idempotency_key: str | None = None,
    ttl_s: float = DEFAULT_TTL_S,
    incident_id: int | None = None,
    state: str = "pending",
    reasoning: dict[str, Any] | None = None,
) -> tuple[Action, bool]:
    """Create an action; with a known ``idempotency_key`` return the existing one instead.
    Returns ``(action, created)``. ``state`` is ``pending`` (ranks get it) or ``proposed``
    (waits for approval; ``ttl_s`` then bounds the wait). The creation is audited with
    ``requested_by`` as the actor."""
    if state not in INITIAL_STATES:
        raise Invalid(f"a new action is pending or proposed, not {state!r}")
    if idempotency_key:
        existing = session.scalar(select(Action).where(Action.idempotency_key == idempotency_key))
        if existing is not None:
            return existing, False
    now = utcnow()
    action = Action(
        job_id=job_id,
        incident_id=incident_id,
        kind=kind,
        state=state,
        idempotency_key=idempotency_key or f"auto-{uuid.uuid4()}",
        requested_by=requested_by,
        target_ranks=sorted(set(target_ranks)) if target_ranks is not None else None,
        params=params or {},
        reason=reason,
        reasoning=reasoning,
        attempt=job_attempt(session=session, job_id=job_id),
        deliveries={},
        created_at=now,
        updated_at=now,
        expires_at=now + timedelta(seconds=ttl_s),
    )
    session.add(action)
    session.flush()
    audit(
        session=session,
        job_id=job_id,
        actor=requested_by,
        event="proposed" if state == "proposed" else "created",
        action_id=action.id,
        incident_id=incident_id,
        detail={"kind": kind, "target_ranks": action.target_ranks, "reason": reason},
        at=now,
    )
    return action, True


def list_actions(*, session: Session, job_id: int, limit: int = 100) -> list[Action]:
    query = select(Action).where(Action.job_id == job_id).order_by(Action.id.desc()).limit(limit)
    return list(session.scalars(query))


def get_action(*, session: Session, action_id: int) -> Action | None:
    return session.get(Action, action_id)


def lock_action(*, session: Session, action_id: int, job_id: int | None = None) -> Action:
    """The action, locked for update; ``NotFound`` if missing or (with ``job_id``) not the
    job's."""
    action = session.scalar(select(Action).where(Action.id == action_id).with_for_update())
    if action is None or (job_id is not None and action.job_id != job_id):
        raise NotFound(f"action {action_id} not found" + (" in this job" if action else ""))
    return action


def cancel(
    *,
    session: Session,
    action_id: int,
    actor: str,
    note: str = "",
    job_id: int | None = None,
    now: datetime | None = None,
) -> Action:
    """Cancel an open action (proposed, pending, dispatched or acked); audited.

    Ranks are no longer handed the action; a rank that already received it may have run it.
    Raises ``NotFound`` or ``Conflict`` (already succeeded, failed, cancelled or expired).
    """
    now = now or utcnow()
    action = lock_action(session=session, action_id=action_id, job_id=job_id)
    if action.state not in CANCELLABLE:
        raise IllegalTransition(
            f"action {action_id} is {action.state} already: it cannot be cancelled",
            extra={"state": action.state, "to": "cancelled"},
        )
    transition(session=session, action=action, to="cancelled", actor=actor, now=now, note=note)
    session.flush()
    return action


def expire_actions(*, session: Session, now: datetime | None = None) -> list[Action]:
    """Mark proposed and pending actions past ``expires_at`` as expired; returns them.

    For a periodic task: a proposal nobody approved, or an action no rank picked up.
    """
    now = now or utcnow()
    query = (
        select(Action)
        .where(Action.state.in_(EXPIRABLE), Action.expires_at < now)
        .order_by(Action.id)
        .with_for_update()
    )
    expired = list(session.scalars(query))
    for action in expired:
        transition(session=session, action=action, to="expired", actor=SYSTEM_ACTOR, now=now)
    session.flush()
    return expired


def expire_for(
    *, session: Session, action: Action, reason: str, now: datetime | None = None
) -> None:
    """Expire one open action because what it was for is gone (its run ended, its incident
    resolved): ``result.expired_because`` and the audit entry say why."""
    action.result = {**(action.result or {}), "expired_because": reason}
    transition(
        session=session,
        action=action,
        to="expired",
        actor=SYSTEM_ACTOR,
        now=now or utcnow(),
        reason=reason,
    )


def _targets(action: Action, rank: int) -> bool:
    return action.target_ranks is None or rank in action.target_ranks


def jobs_with_open_actions(*, session: Session, job_ids: Iterable[int]) -> set[int]:
    """Which of the jobs have an open action: only their batches need
    :func:`dispatch_for_rank` (one query for a request of many batches)."""
    ids = sorted(set(job_ids))
    if not ids:
        return set()
    query = select(Action.job_id).where(Action.job_id.in_(ids), Action.state.in_(OPEN_STATES))
    return set(session.scalars(query.distinct()))


def dispatch_for_rank(
    *, session: Session, job_id: int, rank: int, attempt: int = 0
) -> list[dict[str, Any]]:
    """Open actions this rank has not received yet, marked as dispatched to it.

    Called on every ingest batch, so the common case (no open action) is one indexed query.
    Delivery is at least once: an action is re-sent until the rank reports on it — but
    only to the incarnation of the job it was made for (``attempt``, torchrun's restart
    count): a rank of a later attempt closes it instead (:func:`_supersede`), so a restart
    is never re-run by the group it started, and a lagging rank of an earlier attempt
    does not receive it.
    """
    query = select(Action.id).where(Action.job_id == job_id, Action.state.in_(OPEN_STATES))
    candidates = list(session.scalars(query))
    if not candidates:
        return []
    now = utcnow()
    out = []
    locked = select(Action).where(Action.id.in_(candidates)).order_by(Action.id).with_for_update()
    for action in session.scalars(locked):
        if action.expires_at is not None and action.expires_at < now and action.state == "pending":
            transition(session=session, action=action, to="expired", actor=SYSTEM_ACTOR, now=now)
            continue
        if attempt > action.attempt:
            _supersede(session, action, attempt, now)
            continue
        key = str(rank)
        if attempt < action.attempt or not _targets(action, rank):
            continue
        delivery = action.deliveries.get(key)
        if delivery is not None and delivery["state"] != "dispatched":
            continue  # the rank has reported on it
        # Until the rank acknowledges, every reply carries the action again: a reply lost
        # on the way (the rank then retries its batch) must not lose the action. Ranks
        # ignore action ids they have already seen.
        if delivery is None:
            action.deliveries = {
                **action.deliveries,
                key: {"state": "dispatched", "at": now.isoformat()},
            }
        if action.state == "pending":  # not audited: one hand-out per ingest reply
            transition(
                session=session,
                action=action,
                to="dispatched",
                actor=f"rank:{rank}",
                now=now,
                audited=False,
            )
        action.updated_at = now
        out.append({"id": action.id, "kind": action.kind, "params": action.params})
    session.flush()
    return out


def _supersede(session: Session, action: Action, attempt: int, now: datetime) -> None:
    """The job restarted (it is at ``attempt`` now) before every rank reported on the
    action. A restarting kind that a rank ran did its job: the restart is its outcome.
    Anything else can no longer reach the processes it was meant for: expired."""
    ran = any(d.get("state") == "succeeded" for d in action.deliveries.values())
    action.result = {
        **(action.result or {}),
        "superseded_by_attempt": attempt,
        "note": f"the job restarted (attempt {attempt}) before every rank reported",
    }
    state = "succeeded" if ran and action.kind in RESTARTING_KINDS else "expired"
    transition(
        session=session, action=action, to=state, actor=SYSTEM_ACTOR, now=now, attempt=attempt
    )


def record_report(
    *,
    session: Session,
    job_id: int,
    rank: int,
    world_size: int,
    action_id: int,
    state: str,
    result: dict[str, Any] | None,
) -> bool:
    """Store a rank's report on an action; False if the action is not this job's."""
    action = session.scalar(
        select(Action).where(Action.id == action_id, Action.job_id == job_id).with_for_update()
    )
    if action is None:
        return False
    now = utcnow()
    entry: dict[str, Any] = {"state": state, "at": now.isoformat()}
    if result is not None:
        entry["result"] = result
    deliveries = {**action.deliveries, str(rank): entry}
    action.deliveries = deliveries
    action.updated_at = now
    if action.state not in OPEN_STATES:
        # Late reports are kept per rank but do not reopen a finished action; a report on
        # a proposal (no rank was ever handed it) does not release or finish it either.
        return True
    before = action.state
    targets = action.target_ranks if action.target_ranks is not None else range(world_size)
    states = [deliveries.get(str(r), {}).get("state") for r in targets]
    after = before
    if "failed" in states:
        after = "failed"
    elif states and all(s == "succeeded" for s in states):
        after = "succeeded"
    elif any(s in ("acked", "succeeded") for s in states):
        after = "acked"
    if after in ("failed", "succeeded"):
        action.result = {r: d.get("result") for r, d in deliveries.items() if "result" in d}
    if after != before:  # one audit row per state change, not per rank report
        transition(
            session=session,
            action=action,
            to=after,
            actor=f"rank:{rank}",
            now=now,
            rank_state=state,
        )
    session.flush()
    return True
