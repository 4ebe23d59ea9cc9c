"""The dashboard's chart data, binned on the server. A `read` token, or the dashboard's
sign-in cookie (development: open).

    GET /api/v1/jobs/llama/heatmap?max_ranks=256&max_steps=500   compute time, rank × step
    GET /api/v1/jobs/llama/series?max_steps=1000     step time, loss, peak memory, incidents
    GET /api/v1/jobs/llama/bandwidth?max_steps=500   collective bytes/s per process group
    GET /api/v1/jobs/llama/overview                  current step, goodput, incidents
    GET /api/v1/incidents/12/evidence-chart          the chart that fits the incident's kind
    GET /api/v1/jobs/llama/stacks                    each rank's latest stack dump
    GET /api/v1/incidents/12/stacks                  the dumps taken since the incident opened
    GET /api/v1/jobs/llama/series?run=2              one run of the job (heatmap, bandwidth,
                                                     overview too)

``?run=N`` draws one run of the job (``backend.jobs.runs``): a job name launched again
is a new run, and without it a chart bins every run's steps by step number together.
The page compares two runs by reading each one's series. A run the job does not have is
a 404 naming it; a run that is no number ≥ 1 is a 422 naming ``query.run``.

Keys a chart leaves out stay out of its JSON (``response_model_exclude_unset``): ``rollup``
only where the chart was read from the rollups, bin sizes only where the job has steps.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query

from backend.deps import RowId, RunQuery, SessionDep, StepQuery
from backend.errors import NotFound, errors
from backend.goodput.service import job_goodput
from backend.incidents.service import get_incident
from backend.jobs import service as jobs
from backend.jobs.runs import require_run, run_count
from backend.telemetry import queries
from backend.telemetry.binning import RunRows
from backend.telemetry.evidence import incident_chart
from backend.telemetry.schemas import (
    Bandwidth,
    EvidenceChart,
    Heatmap,
    JobOverview,
    Series,
    StackDumps,
)
from backend.telemetry.stacks import stack_dumps
from backend.ui.auth import ReadApi

router = APIRouter(prefix="/api/v1", tags=["dashboard"])

FromStep = StepQuery


def run_rows(session: SessionDep, job: str, run: int | None) -> tuple[int, RunRows | None]:
    """The job's id and the rows ``?run=`` asks for (None: the whole job)."""
    job_id = jobs.require_job_id(session=session, name=job)
    if run is None:
        return job_id, None
    found = require_run(session=session, job_id=job_id, job=job, number=run)
    return job_id, RunRows.of(found, alone=run_count(session=session, job_id=job_id) == 1)


@router.get(
    "/jobs/{job}/heatmap",
    response_model=Heatmap,
    response_model_exclude_unset=True,
    responses=errors(404, 422),
)
def heatmap(
    job: str,
    session: SessionDep,
    _: ReadApi,
    max_ranks: Annotated[int, Query(ge=1, le=4096)] = 256,
    max_steps: Annotated[int, Query(ge=1, le=5000)] = 500,
    from_step: FromStep = None,
    to_step: FromStep = None,
    agg: Annotated[Literal["avg", "max"], Query()] = "avg",
    run: RunQuery = None,
) -> Any:
    """Compute time (step − collective wait) per rank bin × step bin, at most
    `max_ranks` × `max_steps` cells, aggregated in the database. `z[i][j]` is rank bin `i`
    (ranks `y[i]`…) and step bin `j` (steps `x[j]`…), null where nothing was reported.
    Above 50,000 step rows it reads the job's rollups (bins of 16 … 4,096 steps per rank,
    `rollup` says which); a job without them is sampled above 600,000 rows, each step bin
    represented by evenly spaced steps (`sampled_steps_per_bin`). `run`: that run's steps
    only (read from raw rows when the job has had other runs)."""
    job_id, rows = run_rows(session, job, run)
    return queries.heatmap(
        session=session,
        job_id=job_id,
        max_ranks=max_ranks,
        max_steps=max_steps,
        from_step=from_step,
        to_step=to_step,
        agg=agg,
        rows=rows,
    )


@router.get(
    "/jobs/{job}/series",
    response_model=Series,
    response_model_exclude_unset=True,
    responses=errors(404, 422),
)
def series(
    job: str,
    session: SessionDep,
    _: ReadApi,
    max_steps: Annotated[int, Query(ge=1, le=10_000)] = 1000,
    from_step: FromStep = None,
    to_step: FromStep = None,
    run: RunQuery = None,
) -> Any:
    """Step time (mean and max per bin) and loss of the job's lowest rank, peak memory
    over all ranks, and the job's incidents (to mark at their first step). `run`: that
    run's steps and incidents only, so two runs can be compared step for step (the job
    page overlays two); without it every run of the job is binned together."""
    job_id, rows = run_rows(session, job, run)
    return queries.series(
        session=session,
        job_id=job_id,
        max_steps=max_steps,
        from_step=from_step,
        to_step=to_step,
        rows=rows,
    )


@router.get(
    "/jobs/{job}/bandwidth",
    response_model=Bandwidth,
    response_model_exclude_unset=True,
    responses=errors(404, 422),
)
def bandwidth(
    job: str,
    session: SessionDep,
    _: ReadApi,
    max_steps: Annotated[int, Query(ge=1, le=5000)] = 500,
    from_step: FromStep = None,
    to_step: FromStep = None,
    run: RunQuery = None,
) -> Any:
    """Collective bandwidth (bytes ÷ seconds over all ranks and ops) per group and step
    bin; `run`: that run's collectives only."""
    job_id, rows = run_rows(session, job, run)
    return queries.bandwidth(
        session=session,
        job_id=job_id,
        max_steps=max_steps,
        from_step=from_step,
        to_step=to_step,
        rows=rows,
    )


@router.get(
    "/jobs/{job}/overview",
    response_model=JobOverview,
    response_model_exclude_unset=True,
    responses=errors(404),
)
def job_overview(job: str, session: SessionDep, _: ReadApi, run: RunQuery = None) -> Any:
    """What the dashboard refreshes: current step, goodput, recent incidents. `run`: the
    goodput and incidents of that run alone (the job page's panel for the run it draws;
    the jobs list's, for the current run); without it, the whole job's."""
    found = jobs.get_job(session=session, name=job)
    if found is None:
        raise NotFound(f"job {job!r} not found")
    job_id = run_rows(session, job, run)[0]  # 404 for a run the job does not have
    return {
        "job": found,
        "goodput": job_goodput(session=session, job_id=job_id, now=time.time(), run=run),
        "incidents": queries.incident_marks(session=session, job_id=job_id, limit=50, run=run),
    }


@router.get(
    "/incidents/{incident_id}/evidence-chart",
    response_model=EvidenceChart,
    response_model_exclude_unset=True,
    responses=errors(404),
)
def evidence_chart(incident_id: RowId, session: SessionDep, _: ReadApi) -> Any:
    """The chart that fits the incident's kind, around its first step (`chart` says which):
    `compute` (named ranks' compute time vs the median: stragglers, slowdowns), `numerics`
    (loss and grad norm: nan, loss_spike), `liveness` (each rank's last steps and heartbeat:
    hang, crash), `bandwidth` (slow groups vs the others: comm_anomaly), `none` (a Flight
    Recorder import: its table is on the incident page)."""
    row = get_incident(session=session, incident_id=incident_id)
    if row is None:
        raise NotFound(f"incident {incident_id} not found")
    return incident_chart(session=session, incident=row)


# Dumps taken a little before the incident was stored still belong to it (clock skew).
STACKS_SLACK_S = 5.0


@router.get("/jobs/{job}/stacks", response_model=StackDumps, responses=errors(404))
def job_stacks(job: str, session: SessionDep, _: ReadApi) -> Any:
    """Each rank's latest Python stack dump (the `dump_stacks` action's answer): every
    thread, the training thread first with its innermost frame marked (`hung_frame`), and
    `groups` of ranks stuck in the same place, the odd ones out first."""
    return stack_dumps(session=session, job_id=jobs.require_job_id(session=session, name=job))


@router.get("/incidents/{incident_id}/stacks", response_model=StackDumps, responses=errors(404))
def incident_stacks(incident_id: RowId, session: SessionDep, _: ReadApi) -> Any:
    """The stack dumps of the incident's job taken since it was detected, its named ranks
    first (see `GET /api/v1/jobs/{job}/stacks`)."""
    row = get_incident(session=session, incident_id=incident_id)
    if row is None:
        raise NotFound(f"incident {incident_id} not found")
    return stack_dumps(
        session=session,
        job_id=row.job_id,
        since_ts=row.detected_at.timestamp() - STACKS_SLACK_S,
        first_ranks=row.ranks or [],
    )
