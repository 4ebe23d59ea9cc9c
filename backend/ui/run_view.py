"""What the job and incident pages show of a job's run: whether anyone can be acted on.

    run_context(session=s, job_id=7, actions=rows)
    # {"refusal": "run #2 of job 'llama' finished …" | None,
    #  "refused": {12: "…"}}   # proposals whose Approve is shown disabled, and why

The same reasons the API's 409s give (``backend.jobs.runs.refusal``), so a page never
offers a button whose press would be refused.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy.orm import Session

from backend.actions.models import Action
from backend.db import utcnow
from backend.jobs.runs import refusal as run_refusal


def run_context(*, session: Session, job_id: int, actions: Iterable[Action]) -> dict[str, Any]:
    now = utcnow()
    refusal = run_refusal(session=session, job_id=job_id, now=now)
    refused: dict[int, str] = {}
    for action in actions:
        if action.state != "proposed":
            continue
        why = refusal or run_refusal(
            session=session, job_id=job_id, now=now, attempt=action.attempt
        )
        if why is not None:
            refused[action.id] = why
    return {"refusal": refusal, "refused": refused}
