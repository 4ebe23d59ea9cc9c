"""What the job and incident pages show of a job's runs: whether anyone can be acted on,
and which runs the job page's charts draw.

    run_context(session=s, job_id=7, actions=rows)
    # {"refusal": "run #2 of job 'llama' finished …" | None,
    #  "refused": {12: "…"}}   # proposals whose Approve is shown disabled, and why
    chart_runs(job, run="1", compare="3")    # {"run": 1, "compare": 3}

The same reasons the API's 409s give (``backend.jobs.runs.refusal``), so a page never
offers a button whose press would be refused.

**Comparing runs.** A job name launched again is a new run; the job page draws one run
(``/jobs/llama?run=2``, default: the latest) and may overlay a second on its step-time
and loss charts (``&compare=1``). The page's script reads both from the REST chart routes
(``GET /api/v1/jobs/{job}/series?run=N``); the numbers in the page's address are checked
here as the API checks them: a run the job does not have is a 404 page, anything but a
whole number a 422 page. ``compare`` naming the run shown compares with nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy.orm import Session

from backend.actions.models import Action
from backend.db import utcnow
from backend.jobs.runs import refusal as run_refusal
from backend.ui.errors import PageError


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


def chart_runs(job: dict[str, Any], *, run: str | None, compare: str | None) -> dict[str, Any]:
    """The runs the job page's charts draw: ``run`` (the latest when not given; None for a
    job without runs) and ``compare`` (a second run to overlay, or None)."""
    numbers = [r["number"] for r in job.get("runs") or []]
    shown = _number(job, "run", run, numbers) if run else max(numbers, default=None)
    other = _number(job, "compare", compare, numbers) if compare else None
    return {"run": shown, "compare": None if other == shown else other}


def _number(job: dict[str, Any], field: str, text: str, numbers: list[int]) -> int:
    if not (text.isascii() and text.isdigit() and len(text) <= 10) or int(text) < 1:
        raise PageError(422, f"{field} must be a run number (1, 2, …), not {text[:40]!r}.")
    if int(text) not in numbers:
        raise PageError(404, f"Job {job['name']!r} has no run {int(text)}.")
    return int(text)
