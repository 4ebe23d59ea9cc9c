"""The life cycle of a recovery action: one transition table, one function that moves along it.

    proposed ──approved──▶ pending ──▶ dispatched ──▶ acked ──▶ succeeded | failed
    (any state before succeeded/failed may also end as cancelled or expired)

    transition(session=session, action=action, to="cancelled", actor="api:oncall",
               now=utcnow(), note="false alarm")   # checks, moves, writes the audit row

Every change of ``Action.state`` goes through :func:`transition` (a test checks that no
other module in ``backend/`` assigns it). An action is *created* ``pending`` or
``proposed`` (:data:`INITIAL_STATES`); from there:

- ``proposed``: a person approves it (→ ``pending``, audited as ``approved``), cancels it,
  or nobody does in time (→ ``expired``). It never reaches a rank, so rank reports on it do
  not move it.
- ``pending``: handed to a first rank (→ ``dispatched``); a rank's report may also arrive
  before that (→ ``acked`` | ``succeeded`` | ``failed``); cancelled; expired (nobody picked
  it up in time, or the job restarted first).
- ``dispatched`` and ``acked``: ranks report (→ ``acked`` | ``succeeded`` | ``failed``);
  cancelled; the job restarted before every rank reported (→ ``succeeded`` for a
  restarting kind a rank ran, else ``expired``).
- ``succeeded``, ``failed``, ``cancelled``, ``expired`` are final: later rank reports are
  kept per rank but never reopen the action.

The audit event is the new state, except ``proposed → pending``, which is ``approved``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from backend.actions.models import ACTION_STATES, Action
from backend.audit.models import AuditEntry
from backend.audit.service import audit
from backend.errors import Conflict

INITIAL_STATES = ("pending", "proposed")
TRANSITIONS: dict[str, frozenset[str]] = {
    "proposed": frozenset({"pending", "cancelled", "expired"}),
    "pending": frozenset({"dispatched", "acked", "succeeded", "failed", "cancelled", "expired"}),
    "dispatched": frozenset({"acked", "succeeded", "failed", "cancelled", "expired"}),
    "acked": frozenset({"succeeded", "failed", "cancelled", "expired"}),
    "succeeded": frozenset(),
    "failed": frozenset(),
    "cancelled": frozenset(),
    "expired": frozenset(),
}
TERMINAL_STATES = tuple(s for s in ACTION_STATES if not TRANSITIONS[s])
# Released to ranks and not over: what ingest replies may carry.
OPEN_STATES = ("pending", "dispatched", "acked")
# Audit event names that differ from the state moved to.
EVENTS: dict[tuple[str, str], str] = {("proposed", "pending"): "approved"}


class IllegalTransition(Conflict):
    """The table has no move from the action's state to the one asked for."""


def can_move(before: str, after: str) -> bool:
    """Whether the table allows ``before → after``."""
    return after in TRANSITIONS.get(before, frozenset())


def states_that_can_become(state: str) -> tuple[str, ...]:
    """The states from which ``state`` is a legal move, in ``ACTION_STATES`` order."""
    return tuple(s for s in ACTION_STATES if can_move(s, state))


def transition(
    *,
    session: Session,
    action: Action,
    to: str,
    actor: str,
    now: datetime,
    audited: bool = True,
    **detail: Any,
) -> AuditEntry | None:
    """Move ``action`` to ``to``: check the move, set ``state`` and ``updated_at``, and write
    the audit row (actor, event, ``detail`` with the action's kind and the state it left).

    Raises :class:`IllegalTransition` (a :class:`backend.errors.Conflict`) and changes
    nothing when the table does not allow the move. ``audited=False`` skips the audit row;
    only the per-batch hand-out (``pending → dispatched``) uses it: it happens on an ingest
    reply, its time is in ``deliveries``, and the trail has always left it out.
    Returns the audit entry (None when not audited). Flushes only when it audits.
    """
    before = action.state
    if not can_move(before, to):
        raise IllegalTransition(
            f"action {action.id} is {before}: it cannot become {to}",
            extra={"state": before, "to": to},
        )
    action.state, action.updated_at = to, now
    if not audited:
        return None
    return audit(
        session=session,
        job_id=action.job_id,
        actor=actor,
        event=EVENTS.get((before, to), to),
        action_id=action.id,
        incident_id=action.incident_id,
        detail={"kind": action.kind, "from": before, **detail},
        at=now,
    )
