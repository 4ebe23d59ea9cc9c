"""The serving page's data: a `read` token, or the dashboard's sign-in cookie (development:
open), like the other chart routes (``backend.telemetry.views``).

    GET /api/v1/jobs/chat/serving?since=1732230000&until=1732233600&max_points=120
        traffic, TTFT/TPOT/E2E percentiles, SLO attainment and goodput per time bin;
        the replicas side by side and the slowest over time
    GET /api/v1/jobs/chat/serving/status
        each SLO with its status, one headline (are the SLOs met now?), recent incidents
"""

from __future__ import annotations

import time
from typing import Annotated, Any

from fastapi import APIRouter, Query

from backend.deps import SessionDep
from backend.errors import errors
from backend.jobs import service as jobs
from backend.telemetry import queries, serving_queries
from backend.telemetry.schemas import ServingChart, ServingStatus
from backend.telemetry.serving_status import slo_headline, slo_statuses
from backend.ui.auth import ReadApi

router = APIRouter(prefix="/api/v1", tags=["dashboard"])

EpochS = Annotated[float | None, Query(ge=0, le=1e10, description="epoch seconds")]


@router.get("/jobs/{job}/serving", response_model=ServingChart, responses=errors(404))
def serving_chart(
    job: str,
    session: SessionDep,
    _: ReadApi,
    since: EpochS = None,
    until: EpochS = None,
    max_points: Annotated[int, Query(ge=1, le=serving_queries.MAX_POINTS)] = 120,
) -> Any:
    """Per time bin (whole minutes, merged to at most `max_points` bins): requests, errors,
    output tokens/s and mean TTFT/TPOT, for the job and its slowest replicas (from the
    per-minute sums); p50/p90/p99 of TTFT, TPOT and E2E (from the requests that arrived in
    each bin: at most 50,000 are read, evenly spaced time slices of each bin above that,
    `sampled`); each SLO's attainment and goodput. And each replica over the whole range:
    requests, errors, mean TTFT and TPOT, p90 TTFT. Default range: the hour up to the
    job's last request."""
    return serving_queries.serving_chart(
        session=session,
        job_id=jobs.require_job_id(session=session, name=job),
        job=job,
        since=since,
        until=until,
        max_points=max_points,
    )


@router.get("/jobs/{job}/serving/status", response_model=ServingStatus, responses=errors(404))
def serving_status(job: str, session: SessionDep, _: ReadApi) -> Any:
    """What the serving page refreshes: each SLO with its attainment, goodput, error
    budget and burn rates over its period; a headline saying whether the SLOs are met now
    (no burn-rate alert firing); the job's newest incidents (`slo_burn`, `slow_replica`)."""
    job_id = jobs.require_job_id(session=session, name=job)
    now = time.time()
    statuses = slo_statuses(session=session, job=job, now=now)
    return {
        "job": job,
        "as_of": now,
        "headline": slo_headline(statuses),
        "slos": statuses,
        "incidents": queries.incident_marks(session=session, job_id=job_id, limit=50),
    }
