"""The dashboard's pages (GET). Thin: read through services, render a template.

    /                 jobs at a glance          /alerts      open and recent incidents
    /jobs/{job}       charts, ranks, incidents  /settings    receivers, policies, tokens
                                                             (admins only)
    /jobs/{job}/serving  SLOs, latency, replicas (``backend.ui.serving``)
    /incidents/{id}   evidence and actions      /login       paste an API token

Charts are drawn by the page's script from the JSON endpoints in
``backend.telemetry.views``, so the HTML itself stays quick to render for any job size.
"""

from __future__ import annotations

import time
import uuid
from typing import Any
from urllib.parse import quote

from fastapi import APIRouter, Request, Response
from sqlalchemy import select

from backend.actions import service as actions
from backend.actions.models import ACTION_KINDS
from backend.alerts import service as alerts
from backend.alerts.models import RECEIVER_FORMATS
from backend.alerts.schemas import WebhookOut
from backend.audit.service import list_audit
from backend.auth.models import SCOPES
from backend.auth.service import list_tokens
from backend.deps import SessionDep
from backend.incidents.models import INCIDENT_KINDS
from backend.incidents.service import get_incident
from backend.jobs import service as jobs
from backend.jobs.models import Job
from backend.recovery.models import POLICY_MODES, RecoveryPolicy
from backend.swap.report import job_swap
from backend.ui import overview
from backend.ui.auth import TOKEN_COOKIE, AdminPage, ReadPage, principal, safe_next
from backend.ui.errors import PageError, PageRoute
from backend.ui.evidence import evidence_context, untimed_view
from backend.ui.handling import alerts_context, incident_handling
from backend.ui.render import render
from backend.ui.run_view import chart_runs, run_context, run_panels
from backend.ui.stream import incident_signature

router = APIRouter(route_class=PageRoute, include_in_schema=False)


def job_urls(name: str) -> dict[str, str]:
    q = quote(name, safe="")
    return {
        "page": f"/jobs/{q}",
        "heatmap": f"/api/v1/jobs/{q}/heatmap?max_ranks=256&max_steps=500",
        "series": f"/api/v1/jobs/{q}/series?max_steps=1000",
        "bandwidth": f"/api/v1/jobs/{q}/bandwidth?max_steps=500",
        "overview": f"/api/v1/jobs/{q}/overview",
        "stream": f"/ui/jobs/{q}/stream",
        "actions": f"/ui/jobs/{q}/actions",
        "serving": f"/jobs/{q}/serving",
        "stacks": f"/api/v1/jobs/{q}/stacks",
    }


@router.get("/")
def jobs_page(request: Request, session: SessionDep, _: ReadPage) -> Response:
    """Every job with its health; goodput cells are filled by the page's script."""
    rows = overview.jobs_overview(session=session)
    overview.serving_health(session=session, rows=rows, now=time.time())
    for row in rows:
        row["urls"] = job_urls(row["name"])
        if row["run"] is not None:  # goodput of the current run, as its step time
            row["urls"]["overview"] += f"?run={row['run']['number']}"
    return render(request, "jobs.html", {"jobs": rows}, page={"script": "jobs"})


def run_urls(urls: dict[str, str], charts: dict[str, Any]) -> dict[str, str]:
    """The chart routes for the run the page draws, and the compared run's series."""
    if charts["run"] is None:
        return urls
    out = {key: f"{urls[key]}&run={charts['run']}" for key in ("series", "heatmap", "bandwidth")}
    out["overview"] = f"{urls['overview']}?run={charts['run']}"  # the goodput panel's
    if charts["compare"] is not None:
        out["compare_series"] = f"{urls['series']}&run={charts['compare']}"
    return {**urls, **out}


@router.get("/jobs/{job}")
def job_page(
    request: Request,
    job: str,
    session: SessionDep,
    _: ReadPage,
    run: str | None = None,
    compare: str | None = None,
    incidents: str | None = None,
) -> Response:
    """``?run=N`` draws run N (default: the latest run): its charts, step time, goodput,
    live steps and incidents (``&incidents=all``: every run's); ``&compare=M`` overlays
    run M on the step-time and loss charts (``backend.ui.run_view``)."""
    found = jobs.get_job(session=session, name=job)
    if found is None:
        raise PageError(404, f"No job named {job!r}.")
    job_id = jobs.get_job_id(session=session, name=job)
    assert job_id is not None
    charts = chart_runs(found, run=run, compare=compare)
    urls = run_urls(job_urls(job), charts)
    panels = run_panels(session=session, job_id=job_id, job=found, charts=charts, scope=incidents)
    job_actions = actions.list_actions(session=session, job_id=job_id, limit=20)
    context = {
        "job": found,
        "urls": urls,
        "ranks": jobs.list_ranks(session=session, job_id=job_id, now=time.time()),
        **panels,
        "actions": job_actions,
        **run_context(session=session, job_id=job_id, actions=job_actions),
        "action_kinds": ACTION_KINDS,
        "nonce": uuid.uuid4().hex,
        "swap": job_swap(session=session, job_id=job_id),
        "untimed": untimed_view(session=session, job_id=job_id),
        "stacks_url": urls["stacks"],
        "charts": charts,
    }
    page = {
        "script": "job",
        "job": job,
        "urls": urls,
        "current_step": found["last_step"],
        "incidents_signature": incident_signature(session, job_id),
        "run_state": found["state"],
        "run": charts["run"],
        "compare": charts["compare"],
        "current_run": found["run"]["number"] if found["run"] else None,
        "all_incidents": panels["incident_runs"] is not None,
    }
    return render(request, "job.html", context, page=page)


@router.get("/incidents/{incident_id}")
def incident_page(request: Request, incident_id: int, session: SessionDep, _: ReadPage) -> Response:
    row = get_incident(session=session, incident_id=incident_id)
    if row is None:
        raise PageError(404, f"No incident {incident_id}.")
    job = session.get(Job, row.job_id)
    name = job.name if job else ""
    incident_actions = overview.incident_actions(session=session, incident_id=row.id)
    context = {
        "incident": row,
        "job_name": name,
        "urls": job_urls(name),
        **evidence_context(row.evidence or {}),
        "stacks_url": f"/api/v1/incidents/{row.id}/stacks",
        "actions": incident_actions,
        **run_context(session=session, job_id=row.job_id, actions=incident_actions),
        "audit": list_audit(session=session, job_id=row.job_id, incident_id=row.id, limit=50),
        "action_kinds": ACTION_KINDS,
        "nonce": uuid.uuid4().hex,
        **incident_handling(session, row, name),
    }
    page = {
        "script": "incident",
        "evidence_url": f"/api/v1/incidents/{row.id}/evidence-chart",
        "ranks": list(row.ranks or []),
    }
    return render(request, "incident.html", context, page=page)


@router.get("/alerts")
def alerts_page(request: Request, session: SessionDep, _: ReadPage) -> Response:
    opened, resolved = overview.alerts(session=session)
    return render(request, "alerts.html", alerts_context(session, opened, resolved))


@router.get("/settings")
def settings_page(request: Request, session: SessionDep, who: AdminPage) -> Response:
    """Receivers, policies and tokens: admins only (a reader gets a 403 page)."""
    return render(request, "settings.html", settings_context(session, True))


def settings_context(session: SessionDep, admin: bool) -> dict[str, object]:
    policies = session.scalars(
        select(RecoveryPolicy).order_by(RecoveryPolicy.job, RecoveryPolicy.kind)
    ).all()
    return {
        "receivers": [WebhookOut.of(r) for r in alerts.list_receivers(session=session)],
        "policies": policies,
        "tokens": list_tokens(session=session) if admin else [],
        "formats": RECEIVER_FORMATS,
        "kinds": INCIDENT_KINDS,
        "modes": POLICY_MODES,
        "scopes": SCOPES,
        "new_secret": None,
        "new_token": None,
        "test_result": None,
    }


@router.get("/login")
def login_page(request: Request) -> Response:
    request.state.ui_principal = who = principal(request)
    context = {"next": safe_next(request.query_params.get("next")), "error": None}
    response = render(request, "login.html", context)
    if who is None and request.cookies.get(TOKEN_COOKIE):
        response.delete_cookie(TOKEN_COOKIE, path="/")  # revoked or invalid: forget it
    return response


@router.get("/logout")
def logout_page(request: Request) -> Response:
    """A button that posts the sign-out (a link alone could be followed by another site)."""
    request.state.ui_principal = principal(request)
    return render(request, "logout.html", {})
