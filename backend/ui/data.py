"""The numbers behind the dashboard's charts, aggregated in SQL.

A job of 1,024 ranks × 10,000 steps has 10⁷ step rows; nothing here loads them into
Python. Steps are binned (``GROUP BY (step - lo) / width``) and, above ``ROW_BUDGET`` rows,
each step bin is represented by a few evenly spaced steps read through the
``(job_id, step, rank)`` index, so a chart costs about the same for any job size:

    heatmap(session=s, job_id=7, max_ranks=256, max_steps=500)
    # {"x": [0, 20, …], "y": [0, 4, …], "z": [[0.31, …], …], "step_bin": 20, "rank_bin": 4,
    #  "sampled_steps_per_bin": 1, …}

Series of the whole job (step time, loss) come from its lowest reporting rank through the
``(job_id, rank, step)`` index: in synchronous training every rank has that timeline.

Charts over more than ``RAW_BUDGET`` step rows read ``step_rollups`` instead (sums per
rank and bin of 16 … 4,096 steps, kept by ingest): the finest level whose bins in range,
times the ranks, fit ``ROLLUP_BUDGET``, its bins merged to at most the bins asked. Every
step counts (no sampling); a bin's edges are the level's, so a range's first and last bin
may hold a few steps outside it. Jobs without rollups (rows written around ingest) fall
back to the sampled rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Select, case, func, select
from sqlalchemy.orm import Session

from backend.incidents.models import Incident
from backend.telemetry.models import (
    ROLLUP_WIDTHS,
    CollectiveRecord,
    CollectiveRollup,
    StepRecord,
    StepRollup,
)

ROW_BUDGET = 600_000  # rows one chart query may aggregate before it samples steps
RAW_BUDGET = 50_000  # step rows a chart reads before it reads the job's rollups instead
ROLLUP_BUDGET = 60_000  # rollup rows one chart query may aggregate
MAX_SAMPLED_STEPS = 5_000  # longest list of sampled steps sent to the database
FINITE = 1e300  # |x| below this is finite; NaN (text on SQLite, > all on Postgres) is not


def num(value: Any, digits: int = 6) -> float | None:
    """A JSON-safe float: ``None`` for missing or non-finite values."""
    if value is None:
        return None
    out = float(value)
    return round(out, digits) if math.isfinite(out) else None


@dataclass(frozen=True)
class Extent:
    first_step: int
    last_step: int
    ranks: int  # highest rank + 1

    @classmethod
    def of(cls, session: Session, job_id: int) -> Extent | None:
        """The job's step range and rank count, from index ends (no scan)."""
        row = session.execute(
            select(func.min(StepRecord.step), func.max(StepRecord.step)).where(
                StepRecord.job_id == job_id
            )
        ).one()
        if row[0] is None:
            return None
        top = session.scalar(select(func.max(StepRecord.rank)).where(StepRecord.job_id == job_id))
        return cls(int(row[0]), int(row[1]), int(top or 0) + 1)


@dataclass(frozen=True)
class Bins:
    """Steps ``lo..hi`` in bins of ``width``; ``sample`` lists the steps read, or None (all)."""

    lo: int
    hi: int
    width: int
    count: int
    sample: list[int] | None

    @classmethod
    def plan(cls, lo: int, hi: int, max_bins: int, ranks: int, budget: int | None = None) -> Bins:
        """At most ``max_bins`` bins; sampled when ``ranks`` × steps exceeds ``budget``."""
        budget = ROW_BUDGET if budget is None else budget
        # One sampled step per bin must fit the budget: very many ranks get fewer bins.
        max_bins = max(1, min(max_bins, budget // max(1, ranks)))
        width = max(1, math.ceil((hi - lo + 1) / max_bins))
        count = math.ceil((hi - lo + 1) / width)
        sample = None
        if ranks * (hi - lo + 1) > budget:
            per_bin = max(1, min(budget // max(1, ranks * count), MAX_SAMPLED_STEPS // count))
            if per_bin < width:
                sample = sorted(
                    {
                        lo + b * width + (j * width) // per_bin
                        for b in range(count)
                        for j in range(per_bin)
                        if lo + b * width + (j * width) // per_bin <= hi
                    }
                )
        return cls(lo, hi, width, count, sample)

    def where(self, query: Select[Any], column: Any) -> Select[Any]:
        query = query.where(column >= self.lo, column <= self.hi)
        return query.where(column.in_(self.sample)) if self.sample is not None else query

    def index(self, column: Any) -> Any:
        return ((column - self.lo) // self.width).label("bin")

    def start(self, index: int) -> int:
        return self.lo + index * self.width

    def describe(self) -> dict[str, Any]:
        per_bin = None if self.sample is None else math.ceil(len(self.sample) / self.count)
        return {"step_bin": self.width, "sampled_steps_per_bin": per_bin}


@dataclass(frozen=True)
class Rollup:
    """Bins of ``factor`` consecutive rollup bins of ``level`` (``level_width`` steps each);
    bin 0 starts at step ``lo``. Same interface as ``Bins`` over ``StepRollup`` rows."""

    level: int
    level_width: int
    first: int  # rollup bins first..last are read
    last: int
    factor: int
    count: int

    @classmethod
    def plan(
        cls, session: Session, job_id: int, lo: int, hi: int, max_bins: int, ranks: int
    ) -> Rollup | None:
        """``None`` where raw rows are cheap enough (or the job has no rollups)."""
        if ranks * (hi - lo + 1) <= RAW_BUDGET or not has_rollups(session, job_id):
            return None
        level = next(
            (
                i
                for i, w in enumerate(ROLLUP_WIDTHS)
                if (hi // w - lo // w + 1) * ranks <= ROLLUP_BUDGET
            ),
            len(ROLLUP_WIDTHS) - 1,
        )
        width = ROLLUP_WIDTHS[level]
        first, last = lo // width, hi // width
        factor = max(1, math.ceil((last - first + 1) / max(1, max_bins)))
        return cls(level, width, first, last, factor, math.ceil((last - first + 1) / factor))

    @property
    def lo(self) -> int:
        return self.first * self.level_width

    @property
    def width(self) -> int:
        return self.level_width * self.factor

    def where(self, query: Select[Any], job_id: int) -> Select[Any]:
        r = StepRollup
        return query.where(
            r.job_id == job_id, r.level == self.level, r.bin >= self.first, r.bin <= self.last
        )

    def index(self) -> Any:
        return ((StepRollup.bin - self.first) // self.factor).label("bin")

    def start(self, index: int) -> int:
        return self.lo + index * self.width

    def describe(self) -> dict[str, Any]:
        return {"step_bin": self.width, "sampled_steps_per_bin": None, "rollup": self.level_width}


def has_rollups(session: Session, job_id: int) -> bool:
    """Whether ingest keeps rollups of the job's steps (one row of the coarsest level)."""
    query = select(StepRollup.n).where(
        StepRollup.job_id == job_id, StepRollup.level == len(ROLLUP_WIDTHS) - 1
    )
    return session.execute(query.limit(1)).first() is not None


def _range(ext: Extent, from_step: int | None, to_step: int | None) -> tuple[int, int]:
    lo = ext.first_step if from_step is None else max(from_step, ext.first_step)
    hi = ext.last_step if to_step is None else min(to_step, ext.last_step)
    return lo, max(lo, hi)


def compute_time() -> Any:
    """Step time minus collective wait; the step time when the wait is unknown."""
    return StepRecord.duration_s - func.coalesce(StepRecord.comm_s, 0.0)


def heatmap(
    *,
    session: Session,
    job_id: int,
    max_ranks: int = 256,
    max_steps: int = 500,
    from_step: int | None = None,
    to_step: int | None = None,
    agg: str = "avg",
) -> dict[str, Any]:
    """Compute time per (rank bin, step bin): ``z[rank_bin][step_bin]``, ``None`` where
    nothing was reported. ``agg`` is ``avg`` (default) or ``max`` over each bin."""
    ext = Extent.of(session, job_id)
    if ext is None:
        return {"x": [], "y": [], "z": [], "step_bin": 1, "rank_bin": 1, "value": "compute_s"}
    lo, hi = _range(ext, from_step, to_step)
    rank_width = max(1, math.ceil(ext.ranks / max(1, max_ranks)))
    rank_count = math.ceil(ext.ranks / rank_width)
    bins: Bins | Rollup | None = Rollup.plan(session, job_id, lo, hi, max_steps, ext.ranks)
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
        query = select(step_bin, rank_bin, fn(compute_time())).where(StepRecord.job_id == job_id)
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
        **bins.describe(),
    }


def lowest_rank(session: Session, job_id: int) -> int | None:
    return session.scalar(select(func.min(StepRecord.rank)).where(StepRecord.job_id == job_id))


def _finite(column: Any) -> Any:
    return case((column.between(-FINITE, FINITE), column), else_=None)


def series(
    *,
    session: Session,
    job_id: int,
    max_steps: int = 1000,
    from_step: int | None = None,
    to_step: int | None = None,
) -> dict[str, Any]:
    """Step time (mean and max per bin) and loss of the lowest rank, peak memory over all
    ranks, and the job's incidents with their first step (to mark on the charts)."""
    ext = Extent.of(session, job_id)
    out: dict[str, Any] = {
        "step": [],
        "step_time": [],
        "step_time_max": [],
        "loss": [],
        "nonfinite_loss_steps": [],
        "memory": {"step": [], "max_bytes": []},
        "incidents": incident_marks(session=session, job_id=job_id),
    }
    rank = lowest_rank(session, job_id)
    if ext is None or rank is None:
        return out
    lo, hi = _range(ext, from_step, to_step)
    bins: Bins | Rollup | None = Rollup.plan(session, job_id, lo, hi, max_steps, ranks=1)
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
            ).where(StepRecord.job_id == job_id, StepRecord.rank == rank),
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
        session=session, job_id=job_id, ext=ext, lo=lo, hi=hi, bins=min(max_steps, 300)
    )
    return out


def memory(
    *, session: Session, job_id: int, ext: Extent, lo: int, hi: int, bins: int
) -> dict[str, Any]:
    """Peak ``mem_bytes`` over all ranks per step bin."""
    plan: Bins | Rollup | None = Rollup.plan(session, job_id, lo, hi, bins, ext.ranks)
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
                StepRecord.job_id == job_id, StepRecord.mem_bytes.is_not(None)
            ),
            StepRecord.step,
        )
    rows = session.execute(query.group_by(b).order_by(b)).all()
    return {
        "step": [plan.start(i) for i, _ in rows],
        "max_bytes": [int(v) for _, v in rows],
        **plan.describe(),
    }


def bandwidth(
    *,
    session: Session,
    job_id: int,
    max_steps: int = 500,
    from_step: int | None = None,
    to_step: int | None = None,
) -> dict[str, Any]:
    """Collective bandwidth (bytes ÷ seconds, summed over ranks and ops) per process group
    and step bin: ``{"groups": [{"group": "dp", "step": [...], "bytes_per_s": [...]}]}``."""
    ext = Extent.of(session, job_id)
    if ext is None:
        return {"groups": []}
    lo, hi = _range(ext, from_step, to_step)
    groups: dict[str, dict[str, list[Any]]] = {}
    # Big jobs read the collective rollups (about two groups per rank, hence 2 × ranks).
    plan = Rollup.plan(session, job_id, lo, hi, max_steps, 2 * ext.ranks)
    if plan is not None:
        r = CollectiveRollup
        idx = ((r.bin - plan.first) // plan.factor).label("bin")
        rows = session.execute(
            select(r.group, idx, func.sum(r.sum_bytes), func.sum(r.sum_seconds))
            .where(r.job_id == job_id, r.level == plan.level)
            .where(r.bin >= plan.first, r.bin <= plan.last, r.sum_seconds > 0)
            .group_by(r.group, idx)
            .order_by(r.group, idx)
        )
        for group, index, total, seconds in rows:
            g = groups.setdefault(group, {"step": [], "bytes_per_s": []})
            g["step"].append(plan.start(index))
            g["bytes_per_s"].append(num(float(total or 0) / float(seconds), 1))
        return {
            "groups": [{"group": name, **values} for name, values in sorted(groups.items())],
            **plan.describe(),
        }
    bins = Bins.plan(lo, hi, max_steps, ext.ranks)
    c = CollectiveRecord
    b = bins.index(c.step)
    query = select(c.group, b, func.sum(c.bytes), func.sum(c.duration_s)).where(
        c.job_id == job_id, c.step.is_not(None), c.duration_s > 0
    )
    query = bins.where(query, c.step).group_by(c.group, b).order_by(c.group, b)
    for group, index, total, seconds in session.execute(query):
        g = groups.setdefault(group, {"step": [], "bytes_per_s": []})
        g["step"].append(bins.start(index))
        g["bytes_per_s"].append(num(float(total or 0) / float(seconds), 1))
    return {
        "groups": [{"group": name, **values} for name, values in sorted(groups.items())],
        **bins.describe(),
    }


def incident_marks(*, session: Session, job_id: int, limit: int = 200) -> list[dict[str, Any]]:
    rows = session.scalars(
        select(Incident).where(Incident.job_id == job_id).order_by(Incident.id.desc()).limit(limit)
    )
    return [incident_brief(r) for r in rows]


def incident_brief(row: Incident) -> dict[str, Any]:
    return {
        "id": row.id,
        "kind": row.kind,
        "severity": row.severity,
        "status": row.status,
        "ranks": list(row.ranks or []),
        "first_step": row.first_step,
        "summary": row.summary,
        "detected_at": row.detected_at.isoformat(),
    }
