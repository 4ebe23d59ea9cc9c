"""How a chart bins a job's steps, at about the same cost for any job size.

A job of 1,024 ranks × 10,000 steps has 10⁷ step rows; no chart loads them into Python.
Steps are binned in SQL (``GROUP BY (step - lo) / width``, ``Bins``) and, above
``ROW_BUDGET`` rows, each step bin is represented by a few evenly spaced steps read through
the ``(job_id, step, rank)`` index:

    bins = Bins.plan(0, 9_999, max_bins=500, ranks=1024)   # 500 bins of 20 steps, 1 read each
    query = bins.where(select(bins.index(StepRecord.step), …), StepRecord.step)

Charts over more than ``RAW_BUDGET`` step rows read the rollups instead (``Rollup``: sums
per rank and bin of 16 … 4,096 steps, kept by ingest, ``backend.telemetry.rollups``): the
finest level whose bins in range, times the ranks, fit ``ROLLUP_BUDGET``, its bins merged
to at most the bins asked. Every step counts (no sampling); a bin's edges are the level's,
so a range's first and last bin may hold a few steps outside it. Jobs without rollups (rows
written around ingest) fall back to the sampled rows.

One run of a job (``RunRows``, the routes' ``?run=N``) is its rows of that run's attempt
range (``backend.jobs.runs``). Rollups sum a job's steps whatever the run, so a run of a
job that has had several reads its raw rows (sampled as above); the only run of a job is
all of its rows and reads the rollups as before.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Select, func, select
from sqlalchemy.orm import Session

from backend.jobs.models import Run
from backend.jobs.runs import ATTEMPTS_PER_RUN
from backend.telemetry.models import ROLLUP_WIDTHS, StepRecord, StepRollup

ROW_BUDGET = 600_000  # rows one chart query may aggregate before it samples steps
RAW_BUDGET = 50_000  # step rows a chart reads before it reads the job's rollups instead
ROLLUP_BUDGET = 60_000  # rollup rows one chart query may aggregate
MAX_SAMPLED_STEPS = 5_000  # longest list of sampled steps sent to the database


@dataclass(frozen=True)
class RunRows:
    """The rows of run ``number``: job-wide attempts ``first`` … ``end - 1``. ``alone``: the
    job's only run, so every row of the job is its own and no filter is needed.

        RunRows.of(run, alone=False).only(StepRecord.attempt)   # [attempt >= 10001, …]
    """

    number: int
    first: int
    end: int
    alone: bool

    @classmethod
    def of(cls, run: Run, *, alone: bool) -> RunRows:
        return cls(run.number, run.first_attempt, run.first_attempt + ATTEMPTS_PER_RUN, alone)

    def only(self, attempt: Any) -> list[Any]:
        """Where-clauses keeping the run's rows (none for a job's only run)."""
        return [] if self.alone else [attempt >= self.first, attempt < self.end]


def only(rows: RunRows | None, attempt: Any) -> list[Any]:
    """``rows.only(attempt)``, or no clause at all for the whole job (``rows`` None)."""
    return [] if rows is None else rows.only(attempt)


def mixes_runs(rows: RunRows | None) -> bool:
    """Whether rollups (sums over every run) would mix other runs into ``rows``."""
    return rows is not None and not rows.alone


@dataclass(frozen=True)
class Extent:
    first_step: int
    last_step: int
    ranks: int  # highest rank + 1

    @classmethod
    def of(cls, session: Session, job_id: int, rows: RunRows | None = None) -> Extent | None:
        """The job's (or one run's) step range and rank count, from the index ends (a
        run's read past other runs' rows at the ends, not the whole job)."""
        where = [StepRecord.job_id == job_id, *only(rows, StepRecord.attempt)]
        row = session.execute(
            select(func.min(StepRecord.step), func.max(StepRecord.step)).where(*where)
        ).one()
        if row[0] is None:
            return None
        top = session.scalar(select(func.max(StepRecord.rank)).where(*where))
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
        cls,
        session: Session,
        job_id: int,
        lo: int,
        hi: int,
        max_bins: int,
        ranks: int,
        rows: RunRows | None = None,
    ) -> Rollup | None:
        """``None`` where raw rows are cheap enough, the job has no rollups, or they would
        mix other runs into ``rows``."""
        if ranks * (hi - lo + 1) <= RAW_BUDGET or mixes_runs(rows):
            return None
        if not has_rollups(session, job_id):
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


def step_range(ext: Extent, from_step: int | None, to_step: int | None) -> tuple[int, int]:
    """``from_step..to_step`` clipped to the job's steps (either end open: the job's)."""
    lo = ext.first_step if from_step is None else max(from_step, ext.first_step)
    hi = ext.last_step if to_step is None else min(to_step, ext.last_step)
    return lo, max(lo, hi)
