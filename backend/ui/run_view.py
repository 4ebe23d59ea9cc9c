"""What the job and incident pages show of a job's runs: whether anyone can be acted on,
and which runs the job page's charts draw.

    run_context(session=s, job_id=7, actions=rows)
    # {"refusal": "run #2 of job 'llama' finished …" | None,
    #  "refused": {12: "…"}}   # proposals whose Approve is shown disabled, and why
    chart_runs(job, run="1", compare="3")    # {"run": 1, "compare": 3}
    run_panels(session=s, job_id=7, job=job, charts=charts, scope="all")
    # {"step_time_s": 0.2, "incidents": [...], "open_incidents": 1, …}: the drawn run's

The same reasons the API's 409s give (``backend.jobs.runs.refusal``), so a page never
offers a button whose press would be refused.

**Comparing runs.** A job name launched again is a new run; the job page draws one run
(``/jobs/llama?run=2``, default: the latest) and may overlay a second on its step-time
and loss charts (``&compare=1``). The page's script reads both from the REST chart routes
(``GET /api/v1/jobs/{job}/series?run=N``); the numbers in the page's address are checked
here as the API checks them: a run the job does not have is a 404 page, anything but a
whole number a 422 page. ``compare`` naming the run shown compares with nothing.

**The rest of the page follows the drawn run too**: its median step time, goodput panel
(``/overview?run=N``), live steps (``/ui/jobs/{job}/stream?run=N``) and incidents table
(``&incidents=all``: every run's, each with its run's number).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any
from urllib.parse import quote

from sqlalchemy.orm import Session

from backend.actions.models import Action
from backend.db import utcnow
from backend.incidents.service import list_incidents, run_of
from backend.jobs.runs import refusal as run_refusal
from backend.jobs.runs import require_run
from backend.jobs.service import step_time_s
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


def run_panels(
    *, session: Session, job_id: int, job: dict[str, Any], charts: dict[str, Any], scope: str | None
) -> dict[str, Any]:
    """What the job page shows of the run it draws (``charts["run"]``), besides its charts:
    its median recent step time, its incidents (``scope="all"``: every run's, each with
    its run's number) and how many of those are open, and the link to switch between the
    two. (Its goodput and live steps come from the routes the page's script reads with
    ``?run=``.)"""
    if scope not in (None, "", "run", "all"):
        raise PageError(422, f"incidents must be 'all' or 'run', not {scope[:40]!r}.")
    number, current = charts["run"], (job.get("run") or {}).get("number")
    every_run = scope == "all" or number is None
    step_s = job["step_time_median_s"]
    if number is not None and number != current:
        run = require_run(session=session, job_id=job_id, job=job["name"], number=number)
        step_s = step_time_s(session=session, job_id=job_id, run=run)
    rows = list_incidents(
        session=session, job_id=job_id, limit=50, run=None if every_run else number
    )
    return {
        "step_time_s": step_s,
        "incidents": rows,
        "incident_runs": [run_of(r.fingerprint) for r in rows] if every_run else None,
        "open_incidents": sum(r.status == "open" for r in rows),
        "incidents_scope": _scope_link(job, charts, every_run),
    }


def _scope_link(
    job: dict[str, Any], charts: dict[str, Any], every_run: bool
) -> dict[str, str] | None:
    """The incidents table's "all runs" / "run #N only" link (None: a job with one run)."""
    if len(job.get("runs") or []) < 2:
        return None
    query = f"?run={charts['run']}"
    if charts["compare"] is not None:
        query += f"&compare={charts['compare']}"
    page = f"/jobs/{quote(job['name'], safe='')}"
    if every_run:
        return {"said": "of every run", "href": page + query, "text": f"run #{charts['run']} only"}
    return {
        "said": f"of run #{charts['run']}",
        "href": f"{page}{query}&incidents=all",
        "text": "all runs",
    }


def _number(job: dict[str, Any], field: str, text: str, numbers: list[int]) -> int:
    if not (text.isascii() and text.isdigit() and len(text) <= 10) or int(text) < 1:
        raise PageError(422, f"{field} must be a run number (1, 2, …), not {text[:40]!r}.")
    if int(text) not in numbers:
        raise PageError(404, f"Job {job['name']!r} has no run {int(text)}.")
    return int(text)
