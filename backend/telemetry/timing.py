"""Compute time in SQL: the twin of :func:`detectors.timing.compute_time`.

One definition (see ``detectors/timing.py`` for why): ``step time − time in collectives``,
a missing (``NULL``) collective time counting as 0. The detectors compute it over arrays,
ingest over a batch's steps, the database over stored rows with this expression:

    select(StepRecord.rank, func.avg(compute_time_sql()))   # mean compute time per rank

``tests/backend/telemetry/test_timing.py`` checks that both give the same numbers.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import ColumnElement, func

from backend.telemetry.models import StepRecord


def compute_time_sql(steps: Any = StepRecord) -> ColumnElement[float]:
    """``duration_s - coalesce(comm_s, 0)`` of ``steps`` (``StepRecord`` or an alias of it)."""
    expr: ColumnElement[float] = steps.duration_s - func.coalesce(steps.comm_s, 0.0)
    return expr
