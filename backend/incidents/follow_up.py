"""What follows a change in incidents, in the same transaction: alerts and recovery.

Detection opened or resolved incidents (``backend.incidents.service.apply_findings``); in
the same transaction, so neither can be lost without the other:

- the alert outbox gets a delivery per receiver and state change
  (``backend.alerts.service.notify_changes``);
- the recovery policy proposes or creates an action for each newly opened incident
  (``backend.recovery.service.respond``); the proposals of an incident that resolved, when
  that makes them moot, expire (``backend.recovery.service.retire``).

A slowdown linked as the consequence of another incident (``Changes.linked``) is neither
notified nor acted on: its cause's notification and action are the ones for that fault; if
it had opened before its cause was named, its actions not yet sent to ranks are withdrawn.
An incident re-opened for the same episode (``Changes.reopened``) is notified as firing
again, under the same id, and gets no second action.

Sending the deliveries happens after the commit, off the detection path
(``backend.alerts.tasks.queue_deliveries``): a webhook receiver that is down never slows
detection.

    changes = runner.detect_job(session=session, job_id=7)
    delivery_ids = follow_up(session=session, changes=changes, settings=settings)
    session.commit()
    queue_deliveries(delivery_ids)
"""

from __future__ import annotations

import logging

from sqlalchemy.orm import Session

from backend.alerts.service import notify_changes
from backend.incidents.service import Changes
from backend.recovery.service import respond, retire, withdraw
from backend.settings import Settings

log = logging.getLogger("backend.incidents")


def follow_up(*, session: Session, changes: Changes, settings: Settings) -> list[int]:
    """Queue notifications and apply the recovery policy; returns the new delivery ids."""
    for row in changes.linked:
        log.info("incident linked: %s %s", row.kind, row.summary)
        for action in withdraw(
            session=session,
            incident=row,
            reason=f"incident {row.id} is a consequence of incident "
            f"{row.evidence.get('consequence_of')}, whose action is the one to take",
        ):
            log.warning("recovery: %s withdrawn for incident %s", action.kind, row.id)
    if not (changes.opened or changes.resolved or changes.reopened):
        session.flush()
        return []
    for row in changes.opened:
        log.warning("incident opened: %s %s (ranks %s)", row.kind, row.summary, row.ranks)
    for row in changes.reopened:
        log.warning("incident re-opened: %s %s (ranks %s)", row.kind, row.summary, row.ranks)
    for row in changes.resolved:
        log.info("incident resolved: %s %s", row.kind, row.summary)
    for action in retire(session=session, incidents=changes.resolved):
        log.info("recovery: proposed %s expired: its incident resolved", action.kind)
    deliveries = notify_changes(
        session=session,
        opened=[
            *changes.opened,
            *(r for r in changes.reopened if not (r.evidence or {}).get("consequence_of")),
        ],
        resolved=changes.resolved,
        public_url=settings.public_url,
    )
    # An episode that opened and already cleared (a transient straggler seen after the
    # fact) is on record and notified, but there is nothing left to act on.
    still_open = [row for row in changes.opened if row.status == "open"]
    actions = respond(session=session, incidents=still_open, settings=settings)
    for action in actions:
        log.warning(
            "recovery: %s %s for incident %s (%s)",
            action.kind,
            "proposed" if action.state == "proposed" else "requested",
            action.incident_id,
            action.reason,
        )
    session.flush()
    return [d.id for d in deliveries]
