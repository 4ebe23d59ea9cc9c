"""Periodic action upkeep: expire actions nobody approved or picked up in time."""

from __future__ import annotations

from backend.actions.service import expire_actions as expire
from backend.celery_app import redis_lock, runtime, vigil_task
from backend.db import session_scope, utcnow


@vigil_task("expire_actions")
def expire_actions() -> int:
    rt = runtime()
    with redis_lock("expire_actions", ttl_s=60) as got:
        if not got:
            return 0
        with session_scope(rt.factory, write=True) as session:
            return len(expire(session=session, now=utcnow()))
