"""Webhook delivery as tasks: one right after an incident changes, and a periodic pass
that retries what failed (with the backoff the sender set) and sends what waited its
group's ``group_wait``; another sends reminders, and tells receivers of open incidents
they never heard of (a new receiver, a silence that ended: ``service.catch_up``).

    queue_deliveries([41, 42])   # after the commit that wrote them to the outbox
"""

from __future__ import annotations

import logging

from backend.alerts.sender import send_due, send_one
from backend.alerts.service import catch_up, remind_open
from backend.celery_app import redis_lock, runtime, vigil_task
from backend.db import session_scope

log = logging.getLogger(__name__)


def queue_deliveries(delivery_ids: list[int]) -> None:
    """Hand committed deliveries to the sender: a task each (distributed), or a nudge to
    the embedded server's sender thread. A delivery that cannot be queued is sent by the
    periodic ``send_due_notifications`` instead."""
    if not delivery_ids:
        return
    rt = runtime()
    if rt.redis is None:
        rt.wake_sender()
        return
    for delivery_id in delivery_ids:
        try:
            send_notification.delay(delivery_id)
        except Exception:
            log.warning("could not queue delivery %s; the periodic sender will", delivery_id)


@vigil_task("send_notification")
def send_notification(delivery_id: int) -> None:
    rt = runtime()
    send_one(rt.factory, settings=rt.settings, delivery_id=delivery_id)


@vigil_task("send_due_notifications")
def send_due_notifications() -> int:
    rt = runtime()
    return send_due(rt.factory, settings=rt.settings)


@vigil_task("remind_open_incidents")
def remind_open_incidents() -> None:
    rt = runtime()
    with redis_lock("remind_open_incidents", ttl_s=300) as got:
        if not got:
            return
        with session_scope(rt.factory, write=True) as session:
            public_url = rt.settings.public_url
            made = remind_open(session=session, public_url=public_url)
            made += catch_up(session=session, public_url=public_url)
            ids = [d.id for d in made]
    queue_deliveries(ids)
