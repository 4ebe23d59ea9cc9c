"""What follows a detection run, in the run's own transaction: alerts and recovery.

Detection opened or resolved incidents; in the same transaction (so neither can be lost
without the other) the alert outbox gets a delivery per receiver and state change, and the
recovery policy proposes or creates actions for newly opened incidents. Sending happens
after the commit, off the detection path: a webhook receiver that is down never slows
detection (:func:`after_commit`).
"""

from __future__ import annotations

import logging

from sqlalchemy.orm import Session

from backend.alerts.service import notify_changes
from backend.incidents.service import Changes
from backend.recovery.service import respond
from backend.settings import Settings

log = logging.getLogger("backend.incidents")


def react(*, session: Session, changes: Changes, settings: Settings) -> list[int]:
    """Queue notifications and apply the recovery policy; returns the new delivery ids."""
    if not (changes.opened or changes.resolved):
        return []
    for row in changes.opened:
        log.warning("incident opened: %s %s (ranks %s)", row.kind, row.summary, row.ranks)
    for row in changes.resolved:
        log.info("incident resolved: %s %s", row.kind, row.summary)
    deliveries = notify_changes(
        session=session,
        opened=changes.opened,
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


def after_commit(delivery_ids: list[int]) -> None:
    """Hand committed deliveries to the sender: a task each (distributed) or a nudge to
    the in-process sender thread (embedded)."""
    if not delivery_ids:
        return
    from backend.alerts.tasks import send_notification
    from backend.celery_app import runtime

    rt = runtime()
    if rt.redis is None:
        rt.wake_sender()
        return
    for delivery_id in delivery_ids:
        try:
            send_notification.delay(delivery_id)
        except Exception:  # the periodic send_due picks it up
            log.warning("could not queue delivery %s; the periodic sender will", delivery_id)
