"""The numbers behind the dashboard's charts, aggregated in SQL (steps binned as
``backend.telemetry.binning`` plans), returned as JSON-ready dicts whose shapes
``backend.telemetry.schemas`` documents.

    heatmap(session=s, job_id=7, max_ranks=256, max_steps=500)
    # {"x": [0, 20, …], "y": [0, 4, …], "z": [[0.31, …], …], "step_bin": 20, "rank_bin": 4,
    #  "sampled_steps_per_bin": 1, …}
    series(session=s, job_id=7)        # step time, loss, peak memory, incident marks
    bandwidth(session=s, job_id=7)     # collective bytes/s per process group
    series(session=s, job_id=7, rows=RunRows.of(run, alone=False))   # one run's (``?run=``)
    evidence_chart(session=s, job_id=7, ranks=[3], first_step=1200)

Compute time is ``compute_time_sql()`` (``backend.telemetry.timing``), the definition the
detectors share. Series of the whole job (step time, loss) come from its lowest reporting
rank through the ``(job_id, rank, step)`` index: in synchronous training every rank has
that timeline.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from typing import Any

from sqlalchemy import Double, case, cast, func, select
from sqlalchemy.orm import Session

from backend.incidents.models import Incident
from backend.incidents.service import list_incidents, run_of
from backend.telemetry.binning import Bins, Extent, Rollup, RunRows, only, step_range
from backend.telemetry.models import (
    FINITE,
    CollectiveRecord,
    CollectiveRollup,
    StepRecord,
    StepRollup,
)
from backend.telemetry.timing import compute_time_sql

RECENT_STEP_ROWS = 200  # step rows behind "median recent step time"
EVIDENCE_ROWS = 100_000  # rows the evidence chart may read around the first step
EVIDENCE_RANKS = 8  # named ranks drawn


def median_recent_step_s(
    *,
    session: Session,
    job_id: int,
    rows: int = RECENT_STEP_ROWS,
    run: RunRows | None = None,
    to_step: int | None = None,
) -> float | None:
    """The median of the job's last ``rows`` step rows (any rank; of one run with ``run``,
    as ``/metrics`` reports it): what the jobs list and the job API show as its step time
    (of the job's current run: ``backend.jobs.service.step_time_s``). ``to_step``: the
    run's last step, where known, so the read starts there, not at the steps an earlier,
    longer run reached beyond it. ``None`` before the first step."""
    where = [StepRecord.job_id == job_id, *only(run, StepRecord.attempt)]
    if to_step is not None:
        where.append(StepRecord.step <= to_step)
    recent = session.scalars(
        select(StepRecord.duration_s).where(*where).order_by(StepRecord.step.desc()).limit(rows)
    ).all()
    return statistics.median(recent) if recent else None


def num(value: Any, digits: int = 6) -> float | None:
    """A JSON-safe float: ``None`` for missing or non-finite values."""
    if value is None:
        return None
    out = float(value)
    return round(out, digits) if math.isfinite(out) else None


def heatmap(
    *,
    session: Session,
    job_id: int,
    max_ranks: int = 256,
    max_steps: int = 500,
    from_step: int | None = None,
    to_step: int | None = None,
    agg: str = "avg",
    rows: RunRows | None = None,
) -> dict[str, Any]:
    """Compute time per (rank bin, step bin): ``z[rank_bin][step_bin]``, ``None`` where
    nothing was reported. ``agg`` is ``avg`` (default) or ``max`` over each bin. ``rows``:
    one run's steps only (as in every chart here), its number as ``run``."""
    ext = Extent.of(session, job_id, rows)
    run = {} if rows is None else {"run": rows.number}
    if ext is None:
        empty = {"x": [], "y": [], "z": [], "step_bin": 1, "rank_bin": 1}
        return {**empty, "value": "compute_s", **run}
    lo, hi = step_range(ext, from_step, to_step)
    rank_width = max(1, math.ceil(ext.ranks / max(1, max_ranks)))
    rank_count = math.ceil(ext.ranks / rank_width)
    bins: Bins | Rollup | None = Rollup.plan(session, job_id, lo, hi, max_steps, ext.ranks, rows)
    if isinstance(bins, Rollup):
        r = StepRollup
        value = func.max(r.max_compute) if agg == "max" else func.sum(r.sum_compute) / func.sum(r.n)
        step_bin, rank_bin = bins.index(), (r.rank // rank_width).label("rank_bin")
        query = bins.where(select(step_bin, rank_bin, value), job_id)
    else:
        bins = Bins.plan(lo, hi, max_steps, ext.ranks)
        fn = func.max if agg == "max" else func.avg
        step_bin = bins.index(StepRecord.step)
        rank_bin = (StepRecord.rank // rank_width).label("rank_bin")
        query = select(step_bin, rank_bin, fn(compute_time_sql())).where(
            StepRecord.job_id == job_id, *only(rows, StepRecord.attempt)
        )
        query = bins.where(query, StepRecord.step)
    query = query.group_by(step_bin, rank_bin)
    z: list[list[float | None]] = [[None] * bins.count for _ in range(rank_count)]
    for b, r, value in session.execute(query):
        if 0 <= r < rank_count and 0 <= b < bins.count:
            z[r][b] = num(value)
    return {
        "x": [bins.start(b) for b in range(bins.count)],
        "y": [r * rank_width for r in range(rank_count)],
        "z": z,
        "rank_bin": rank_width,
        "ranks": ext.ranks,
        "agg": "max" if agg == "max" else "avg",
        "value": "compute_s",
        **run,
        **bins.describe(),
    }


def lowest_rank(session: Session, job_id: int, rows: RunRows | None = None) -> int | None:
    where = [StepRecord.job_id == job_id, *only(rows, StepRecord.attempt)]
    return session.scalar(select(func.min(StepRecord.rank)).where(*where))


def _finite(column: Any) -> Any:
    return case((column.between(-FINITE, FINITE), column), else_=None)


def series(
    *,
    session: Session,
    job_id: int,
    max_steps: int = 1000,
    from_step: int | None = None,
    to_step: int | None = None,
    rows: RunRows | None = None,
) -> dict[str, Any]:
    """Step time (mean and max per bin) and loss of the lowest rank, peak memory over all
    ranks, and the job's incidents with their first step (to mark on the charts); with
    ``rows``, of that run only (its incidents: ``backend.incidents.service.run_of``)."""
    ext = Extent.of(session, job_id, rows)
    out: dict[str, Any] = {
        "step": [],
        "step_time": [],
        "step_time_max": [],
        "loss": [],
        "nonfinite_loss_steps": [],
        "memory": {"step": [], "max_bytes": []},
        "incidents": incident_marks(
            session=session, job_id=job_id, run=None if rows is None else rows.number
        ),
    }
    if rows is not None:
        out["run"] = rows.number
    rank = lowest_rank(session, job_id, rows)
    if ext is None or rank is None:
        return out
    lo, hi = step_range(ext, from_step, to_step)
    bins: Bins | Rollup | None = Rollup.plan(session, job_id, lo, hi, max_steps, 1, rows)
    if isinstance(bins, Rollup):
        r = StepRollup
        b = bins.index()
        loss_sum = func.sum(r.sum_loss)
        query = bins.where(
            select(
                b,
                func.sum(r.sum_duration) / func.sum(r.n),
                func.max(r.max_duration),
                case((func.sum(r.n_loss) > 0, loss_sum / func.sum(r.n_loss)), else_=None),
                func.sum(r.n_nonfinite_loss),
                func.min(r.bin) * bins.level_width,
            ).where(r.rank == rank),
            job_id,
        )
    else:
        bins = Bins.plan(lo, hi, max_steps, ranks=1)
        loss = StepRecord.loss
        nonfinite = case((loss.is_not(None) & ~loss.between(-FINITE, FINITE), 1), else_=0)
        b = bins.index(StepRecord.step)
        query = bins.where(
            select(
                b,
                func.avg(StepRecord.duration_s),
                func.max(StepRecord.duration_s),
                func.avg(_finite(loss)),
                func.sum(nonfinite),
                func.min(StepRecord.step),
            ).where(
                StepRecord.job_id == job_id,
                StepRecord.rank == rank,
                *only(rows, StepRecord.attempt),
            ),
            StepRecord.step,
        )
    for index, avg, top, mean_loss, bad, first in session.execute(query.group_by(b).order_by(b)):
        out["step"].append(bins.start(index))
        out["step_time"].append(num(avg))
        out["step_time_max"].append(num(top))
        out["loss"].append(num(mean_loss))
        if bad:
            out["nonfinite_loss_steps"].append(int(first))
    out.update(rank=rank, **bins.describe())
    out["memory"] = memory(
        session=session,
        job_id=job_id,
        ext=ext,
        lo=lo,
        hi=hi,
        bins=min(max_steps, 300),
        rows=rows,
    )
    return out


def memory(
    *,
    session: Session,
    job_id: int,
    ext: Extent,
    lo: int,
    hi: int,
    bins: int,
    rows: RunRows | None = None,
) -> dict[str, Any]:
    """Peak ``mem_bytes`` over all ranks per step bin."""
    plan: Bins | Rollup | None = Rollup.plan(session, job_id, lo, hi, bins, ext.ranks, rows)
    if isinstance(plan, Rollup):
        b = plan.index()
        query = plan.where(
            select(b, func.max(StepRollup.max_mem)).where(StepRollup.max_mem.is_not(None)),
            job_id,
        )
    else:
        plan = Bins.plan(lo, hi, bins, ext.ranks)
        b = plan.index(StepRecord.step)
        query = plan.where(
            select(b, func.max(StepRecord.mem_bytes)).where(
                StepRecord.job_id == job_id,
                StepRecord.mem_bytes.is_not(None),
                *only(rows, StepRecord.attempt),
            ),
            StepRecord.step,
        )
    found = session.execute(query.group_by(b).order_by(b)).all()
    return {
        "step": [plan.start(i) for i, _ in found],
        "max_bytes": [int(v) for _, v in found],
        **plan.describe(),
    }


def bandwidth(
    *,
    session: Session,
    job_id: int,
    max_steps: int = 500,
    from_step: int | None = None,
    to_step: int | None = None,
    rows: RunRows | None = None,
) -> dict[str, Any]:
    """Collective bandwidth (bytes ÷ seconds, summed over ranks and ops) per process group
    and step bin: ``{"groups": [{"group": "dp", "step": [...], "bytes_per_s": [...]}]}``."""
    ext = Extent.of(session, job_id, rows)
    run = {} if rows is None else {"run": rows.number}
    if ext is None:
        return {"groups": [], **run}
    lo, hi = step_range(ext, from_step, to_step)
    groups: dict[str, dict[str, list[Any]]] = {}
    # Big jobs read the collective rollups (about two groups per rank, hence 2 × ranks).
    plan = Rollup.plan(session, job_id, lo, hi, max_steps, 2 * ext.ranks, rows)
    if plan is not None:
        r = CollectiveRollup
        idx = ((r.bin - plan.first) // plan.factor).label("bin")
        rolled = session.execute(
            select(r.group, idx, func.sum(r.sum_bytes), func.sum(r.sum_seconds))
            .where(r.job_id == job_id, r.level == plan.level)
            .where(r.bin >= plan.first, r.bin <= plan.last, r.sum_seconds > 0)
            .group_by(r.group, idx)
            .order_by(r.group, idx)
        )
        for group, index, total, seconds in rolled:
            g = groups.setdefault(group, {"step": [], "bytes_per_s": []})
            g["step"].append(plan.start(index))
            g["bytes_per_s"].append(num(float(total or 0) / float(seconds), 1))
        return {
            "groups": [{"group": name, **values} for name, values in sorted(groups.items())],
            **run,
            **plan.describe(),
        }
    bins = Bins.plan(lo, hi, max_steps, ext.ranks)
    c = CollectiveRecord
    b = bins.index(c.step)
    total_bytes = func.sum(cast(c.bytes, Double))  # SQLite's integer sum() overflows at 2**63
    query = select(c.group, b, total_bytes, func.sum(c.duration_s)).where(
        c.job_id == job_id, c.step.is_not(None), c.duration_s > 0, *only(rows, c.attempt)
    )
    query = bins.where(query, c.step).group_by(c.group, b).order_by(c.group, b)
    for group, index, total, seconds in session.execute(query):
        g = groups.setdefault(group, {"step": [], "bytes_per_s": []})
        g["step"].append(bins.start(index))
        g["bytes_per_s"].append(num(float(total or 0) / float(seconds), 1))
    return {
        "groups": [{"group": name, **values} for name, values in sorted(groups.items())],
        **run,
        **bins.describe(),
    }


def evidence_chart(
    *, session: Session, job_id: int, ranks: Iterable[int], first_step: int | None
) -> dict[str, Any]:
    """Compute time per step around ``first_step`` (the job's last step if ``None``): the
    median over all ranks and each of ``ranks`` (at most ``EVIDENCE_RANKS``). Reads at most
    ``EVIDENCE_ROWS`` rows."""
    ext = Extent.of(session, job_id)
    named = [int(r) for r in ranks][:EVIDENCE_RANKS]
    out: dict[str, Any] = {"step": [], "median": [], "ranks": [], "first_step": None}
    if ext is None:
        return out
    center = ext.last_step if first_step is None else int(first_step)
    half = max(5, min(100, EVIDENCE_ROWS // (2 * ext.ranks)))
    lo, hi = max(ext.first_step, center - half), min(ext.last_step, center + half)
    rows = session.execute(
        select(StepRecord.step, StepRecord.rank, compute_time_sql()).where(
            StepRecord.job_id == job_id,
            StepRecord.step >= lo,
            StepRecord.step <= hi,
        )
    ).all()
    by_step: dict[int, list[float]] = {}
    by_rank: dict[int, dict[int, float]] = {r: {} for r in named}
    for step, rank, value in rows:
        by_step.setdefault(int(step), []).append(float(value))
        if rank in by_rank:
            by_rank[rank][int(step)] = float(value)
    steps = sorted(by_step)
    out["step"] = steps
    out["median"] = [num(statistics.median(by_step[s])) for s in steps]
    out["ranks"] = [
        {"rank": r, "compute_s": [num(by_rank[r].get(s)) for s in steps]} for r in named
    ]
    out["first_step"] = first_step
    return out


def incident_marks(
    *, session: Session, job_id: int, limit: int = 200, run: int | None = None
) -> list[dict[str, Any]]:
    """The job's (or its run ``run``'s) newest incidents, as the charts mark them at their
    first step, each with its run's number."""
    found = list_incidents(session=session, job_id=job_id, limit=limit, run=run)
    return [_mark(row) for row in found]


def _mark(row: Incident) -> dict[str, Any]:
    return {
        "id": row.id,
        "run": run_of(row.fingerprint),
        "kind": row.kind,
        "severity": row.severity,
        "status": row.status,
        "ranks": list(row.ranks or []),
        "first_step": row.first_step,
        "summary": row.summary,
        "detected_at": row.detected_at.isoformat(),
    }
