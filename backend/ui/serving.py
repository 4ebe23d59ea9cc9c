"""The serving page: is a serving job meeting its SLOs now, and if not, where it hurts.

    /jobs/{job}/serving   headline, SLOs, incidents, latency percentiles, attainment,
                          goodput, error budget, burn rates, replicas side by side

The headline, the SLO table and the incidents are rendered here (from
``backend.telemetry.serving_status``); the charts are drawn by ``serving.js`` from
``GET /api/v1/jobs/{job}/serving`` and refreshed, with the headline, every ``REFRESH_S``
seconds from ``…/serving/status``.
"""

from __future__ import annotations

import time
from urllib.parse import quote

from fastapi import APIRouter, Request, Response

from backend.deps import SessionDep
from backend.incidents.service import list_incidents
from backend.jobs import service as jobs
from backend.telemetry.serving_status import slo_headline, slo_statuses, window_text
from backend.ui.auth import ReadPage
from backend.ui.errors import PageError, PageRoute
from backend.ui.render import render

router = APIRouter(route_class=PageRoute, include_in_schema=False)

REFRESH_S = 10  # how often the page polls for new data
RANGES = (("1h", 3600), ("6h", 6 * 3600), ("24h", 86400), ("7d", 7 * 86400))


def serving_urls(name: str) -> dict[str, str]:
    q = quote(name, safe="")
    return {
        "page": f"/jobs/{q}/serving",
        "job": f"/jobs/{q}",
        "chart": f"/api/v1/jobs/{q}/serving",
        "status": f"/api/v1/jobs/{q}/serving/status",
    }


@router.get("/jobs/{job}/serving")
def serving_page(request: Request, job: str, session: SessionDep, _: ReadPage) -> Response:
    found = jobs.get_job(session=session, name=job)
    if found is None:
        raise PageError(404, f"No job named {job!r}.")
    job_id = jobs.require_job_id(session=session, name=job)
    urls = serving_urls(job)
    statuses = slo_statuses(session=session, job=job, now=time.time())
    context = {
        "job": found,
        "urls": urls,
        "slos": statuses,
        "headline": slo_headline(statuses),
        "incidents": list_incidents(session=session, job_id=job_id, limit=50),
        "ranges": RANGES,
        "window_text": window_text,
    }
    page = {"script": "serving", "job": job, "urls": urls, "refresh_s": REFRESH_S}
    return render(request, "serving.html", context, page=page)
