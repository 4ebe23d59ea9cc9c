"""A job with a straggler incident and a proposed action, for the page tests."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import select

from backend.actions.models import Action
from tests.frontend.helpers import JOB, detect, ingest_job


@pytest.fixture
def straggler(client, session, settings) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    """``{"job", "incident", "action"}``: rank 2 of 4 turned slow at step 50; the
    built-in policy proposed an action and waits for approval."""
    ingest_job(client)
    [incident] = detect(session, settings)
    action = session.scalar(select(Action).where(Action.incident_id == incident.id))
    assert incident.kind == "straggler" and action is not None
    assert action.state == "proposed"
    return {"job": JOB, "incident": incident, "action": action}
