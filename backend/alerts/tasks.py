"""Webhook delivery as tasks: one right after an incident changes, and a periodic pass
that retries what failed (with the backoff the sender set) and sends reminders."""

from __future__ import annotations

from backend.alerts.sender import send_due, send_one
from backend.alerts.service import remind_open
from backend.celery_app import redis_lock, runtime, vigil_task
from backend.db import session_scope
from backend.pipeline import after_commit


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
            ids = [d.id for d in remind_open(session=session, public_url=rt.settings.public_url)]
    after_commit(ids)
