"""Migration 0013: deliveries made before grouping are linked to their incident, so a
receiver told an incident fired before the upgrade still hears it resolve (and gets no
second "first" notification); existing receivers take the format's default grouping; and
neither direction rebuilds ``incidents`` (on SQLite that would clear every delivery's,
action's and audit entry's link to its incident)."""

from __future__ import annotations

import pytest
from alembic import command
from sqlalchemy import text

from backend.db import make_engine
from backend.migrate import alembic_config
from tests.conftest import BACKENDS, backend_url

NOW = "2026-11-26 00:00:00+00:00"
ROWS = [
    "INSERT INTO jobs (id, name, kind, world_size, attempt, created_at) "
    "VALUES (1, 'job-1', 'training', 1, 0, :now)",
    "INSERT INTO incidents (id, job_id, kind, severity, status, fingerprint, ranks, summary, "
    "evidence, detected_at, updated_at) VALUES (7, 1, 'hang', 'critical', 'open', '1:hang', "
    "'[]', '', '{}', :now, :now)",
    "INSERT INTO webhook_receivers (id, name, url, format, headers, send_resolved, "
    "repeat_interval_s, enabled, created_at, updated_at) VALUES (3, 'am', 'http://x/', "
    "'alertmanager', '{}', true, 60, true, :now, :now)",
    "INSERT INTO webhook_deliveries (id, receiver_id, incident_id, status, state, webhook_id, "
    "payload, attempts, next_attempt_at, created_at) VALUES (5, 3, 7, 'firing', 'delivered', "
    "'msg_1', '{}', 1, :now, :now)",
]


@pytest.fixture(params=BACKENDS)
def url(request, tmp_path_factory):  # type: ignore[no-untyped-def]
    return backend_url(request.param, tmp_path_factory, suffix="alerts0013")


def test_old_deliveries_are_linked_and_receivers_keep_working(url):
    config = alembic_config(url)
    command.upgrade(config, "0012")
    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            for sql in ROWS:
                conn.execute(text(sql), {"now": NOW})
        command.upgrade(config, "0013")
        with engine.connect() as conn:
            links = conn.execute(
                text("SELECT delivery_id, incident_id FROM webhook_delivery_incidents")
            )
            assert [tuple(r) for r in links] == [(5, 7)]
            receiver = conn.execute(text("SELECT group_by, group_wait_s FROM webhook_receivers"))
            assert [tuple(r) for r in receiver] == [(None, 10)]
            incident = conn.execute(text("SELECT held, acked_at FROM incidents")).one()
            assert (bool(incident[0]), incident[1]) == (False, None)
        command.downgrade(config, "0012")
        with engine.connect() as conn:  # nothing that points at an incident lost its link
            delivery = conn.execute(text("SELECT incident_id FROM webhook_deliveries")).one()
            assert tuple(delivery) == (7,)
    finally:
        engine.dispose()
