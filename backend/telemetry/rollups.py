"""Rollups: the charts' downsampling pyramids, kept by ingest in the transaction that stores
the records, and rebuilt from the records when they were loaded around ingest.

    add_step_rollups(session=s, job_id=7, rank=3, steps=[{"step": 120, "duration_s": 0.31,
        "comm_s": 0.12, "loss": 2.1, "mem_bytes": 7_000_000_000}, …])
    add_collective_rollups(session=s, job_id=7, rank=3, records=[{"step": 120,
        "group": "dp", "bytes": 4194304, "duration_s": 0.012}, …])
    rebuild_rollups(session=s, job_id=7)   # both, after loading around ingest (``COPY``)

Step rollups (``step_rollups``): per rank and bin of every level of ``ROLLUP_WIDTHS``, the
step count, sums and maxima of step time and compute time (``detectors.timing``), finite
losses and their sum, non-finite losses, peak memory. A batch is summed per bin here, then
one upsert per bin adds it to the stored sums, so 5,000 steps cost about 420 upserted rows
over all levels. A retried batch writes nothing (ingest's idempotency), so nothing is
counted twice.

Collective rollups (``collective_rollups``): each rank's collective bytes and seconds per
bin and process group. Sums only, so bandwidth over any set of bins is exact:
``sum(sum_bytes) / sum(sum_seconds)``.

Every writer upserts its rows in the order of the unique index (job, level, bin, rank, …),
so concurrent batches never deadlock; on PostgreSQL one statement takes columns of arrays
(a round trip per batch, or per ``/ingest/multi`` request, not per row). The rows of many
batches go in one statement, or one per repeat of a bin (``backend.db.unique_rounds``).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from sqlalchemy import Double, Integer, case, cast, delete, func, insert, literal, select, text
from sqlalchemy.orm import Session

from backend.db import insert_for, unique_rounds
from backend.telemetry.models import (
    FINITE,
    ROLLUP_WIDTHS,
    CollectiveRecord,
    CollectiveRollup,
    StepRecord,
    StepRollup,
)
from backend.telemetry.timing import compute_time_sql
from detectors.timing import compute_time


def rebuild_rollups(*, session: Session, job_id: int) -> None:
    """Recompute the job's step and collective rollups from its records, in SQL."""
    rebuild_step_rollups(session=session, job_id=job_id)
    rebuild_collective_rollups(session=session, job_id=job_id)


# --- step rollups ---------------------------------------------------------------------------


def add_step_rollups(
    *, session: Session, job_id: int, rank: int, steps: list[dict[str, Any]]
) -> None:
    """Add one rank's step events (ingest events) to their bins of every rollup level."""
    upsert_step_rollups(
        session=session, rows=step_rollup_rows(job_id=job_id, rank=rank, steps=steps)
    )


def step_rollup_rows(
    *, job_id: int, rank: int, steps: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """One rank's step events summed per bin of every level: the rows to add."""
    # [n, sum_duration, max_duration, sum_compute, max_compute, n_loss, sum_loss,
    #  n_nonfinite_loss, max_mem] per bin, finest level first, coarser ones from it.
    finest: dict[int, list[Any]] = {}
    width = ROLLUP_WIDTHS[0]
    computes = compute_time(
        [e["duration_s"] for e in steps], [e.get("comm_s") for e in steps]
    ).tolist()
    for e, compute in zip(steps, computes, strict=True):
        duration = float(e["duration_s"])
        loss, mem = e.get("loss"), e.get("mem_bytes")
        acc = finest.get(e["step"] // width)
        if acc is None:
            finest[e["step"] // width] = [
                1,
                duration,
                duration,
                compute,
                compute,
                *_loss_parts(loss),
                mem,
            ]
            continue
        acc[0] += 1
        acc[1] += duration
        acc[2] = max(acc[2], duration)
        acc[3] += compute
        acc[4] = max(acc[4], compute)
        n_loss, sum_loss, bad = _loss_parts(loss)
        acc[5] += n_loss
        acc[6] += sum_loss
        acc[7] += bad
        if mem is not None:
            acc[8] = mem if acc[8] is None else max(acc[8], mem)
    rows: list[dict[str, Any]] = []
    level_bins = finest
    for level, width in enumerate(ROLLUP_WIDTHS):
        if level:
            factor = width // ROLLUP_WIDTHS[level - 1]
            coarser: dict[int, list[Any]] = {}
            for b, acc in level_bins.items():
                into = coarser.get(b // factor)
                if into is None:
                    coarser[b // factor] = list(acc)
                else:
                    _merge(into, acc)
            level_bins = coarser
        rows.extend(
            {
                "job_id": job_id,
                "level": level,
                "bin": b,
                "rank": rank,
                "n": acc[0],
                "sum_duration": acc[1],
                "max_duration": acc[2],
                "sum_compute": acc[3],
                "max_compute": acc[4],
                "n_loss": acc[5],
                "sum_loss": acc[6],
                "n_nonfinite_loss": acc[7],
                "max_mem": acc[8],
            }
            for b, acc in level_bins.items()
        )
    return rows


def upsert_step_rollups(*, session: Session, rows: list[dict[str, Any]]) -> None:
    """Add ``rows`` (:func:`step_rollup_rows`, of any ranks and jobs) to the stored sums:
    one statement, or one per repeat when a bin comes more than once (a rank's second
    batch), so each is added in turn, as batch after batch would."""
    for part in unique_rounds(rows, key=_STEP_KEY):
        _upsert_step_rollups(session, part)


_STEP_KEY = ("job_id", "level", "bin", "rank")  # the unique index: one lock order for all


def _upsert_step_rollups(session: Session, rows: list[dict[str, Any]]) -> None:
    if session.get_bind().dialect.name == "postgresql":
        # One statement with a column of arrays: a round trip per batch, not per row.
        columns = {name: [row[name] for row in rows] for name in _ROLLUP_ARRAYS}
        session.execute(_UPSERT_STEPS_PG, columns)
        return
    stmt = insert_for(session, StepRollup)
    new, cur = stmt.excluded, StepRollup.__table__.c
    # SQLite's two-argument max() is NULL if either side is, so max_mem takes the other
    # side first.
    stmt = stmt.on_conflict_do_update(
        index_elements=["job_id", "level", "bin", "rank"],
        set_={
            "n": cur.n + new.n,
            "sum_duration": cur.sum_duration + new.sum_duration,
            "max_duration": func.max(cur.max_duration, new.max_duration),
            "sum_compute": cur.sum_compute + new.sum_compute,
            "max_compute": func.max(cur.max_compute, new.max_compute),
            "n_loss": cur.n_loss + new.n_loss,
            "sum_loss": cur.sum_loss + new.sum_loss,
            "n_nonfinite_loss": cur.n_nonfinite_loss + new.n_nonfinite_loss,
            "max_mem": func.max(
                func.coalesce(cur.max_mem, new.max_mem), func.coalesce(new.max_mem, cur.max_mem)
            ),
        },
    )
    session.execute(stmt, rows)


# Column -> PostgreSQL array type of the rollup upsert's parameters.
_ROLLUP_ARRAYS = {
    "job_id": "int[]",
    "level": "int[]",
    "rank": "int[]",
    "bin": "bigint[]",
    "n": "int[]",
    "sum_duration": "float8[]",
    "max_duration": "float8[]",
    "sum_compute": "float8[]",
    "max_compute": "float8[]",
    "n_loss": "int[]",
    "sum_loss": "float8[]",
    "n_nonfinite_loss": "int[]",
    "max_mem": "bigint[]",
}
_UPSERT_STEPS_PG = text(
    f"INSERT INTO step_rollups ({', '.join(_ROLLUP_ARRAYS)}) "
    f"SELECT * FROM unnest("
    + ", ".join(f"CAST(:{name} AS {kind})" for name, kind in _ROLLUP_ARRAYS.items())
    + ") ON CONFLICT (job_id, level, bin, rank) DO UPDATE SET "
    "n = step_rollups.n + excluded.n, "
    "sum_duration = step_rollups.sum_duration + excluded.sum_duration, "
    "max_duration = greatest(step_rollups.max_duration, excluded.max_duration), "
    "sum_compute = step_rollups.sum_compute + excluded.sum_compute, "
    "max_compute = greatest(step_rollups.max_compute, excluded.max_compute), "
    "n_loss = step_rollups.n_loss + excluded.n_loss, "
    "sum_loss = step_rollups.sum_loss + excluded.sum_loss, "
    "n_nonfinite_loss = step_rollups.n_nonfinite_loss + excluded.n_nonfinite_loss, "
    "max_mem = greatest(step_rollups.max_mem, excluded.max_mem)"  # NULLs are skipped
)


def _loss_parts(loss: Any) -> tuple[int, float, int]:
    """(finite count, finite sum, non-finite count) of one loss value."""
    if loss is None:
        return 0, 0.0, 0
    if -FINITE <= loss <= FINITE:
        return 1, float(loss), 0
    return 0, 0.0, 1


def _merge(into: list[Any], acc: list[Any]) -> None:
    into[0] += acc[0]
    into[1] += acc[1]
    into[2] = max(into[2], acc[2])
    into[3] += acc[3]
    into[4] = max(into[4], acc[4])
    into[5] += acc[5]
    into[6] += acc[6]
    into[7] += acc[7]
    if acc[8] is not None:
        into[8] = acc[8] if into[8] is None else max(into[8], acc[8])


def rebuild_step_rollups(*, session: Session, job_id: int) -> None:
    """Recompute the job's ``step_rollups`` from its ``steps`` in SQL: one pass over the
    steps for the finest level, then each level from the one below."""
    session.execute(delete(StepRollup).where(StepRollup.job_id == job_id))
    r, s = StepRollup, StepRecord
    finite = s.loss.between(-FINITE, FINITE)
    compute = compute_time_sql(s)
    width = ROLLUP_WIDTHS[0]
    b = (s.step // literal(width, Integer)).label("bin")
    columns = ["job_id", "level", "bin", "rank", "n", "sum_duration", "max_duration"]
    columns += ["sum_compute", "max_compute", "n_loss", "sum_loss", "n_nonfinite_loss"]
    columns += ["max_mem"]
    query = (
        select(
            s.job_id,
            literal(0, Integer),
            b,
            s.rank,
            func.count(),
            func.sum(s.duration_s),
            func.max(s.duration_s),
            func.sum(compute),
            func.max(compute),
            func.sum(case((finite, 1), else_=0)),
            func.coalesce(func.sum(case((finite, s.loss), else_=None)), 0.0),
            func.sum(case((s.loss.is_not(None) & ~finite, 1), else_=0)),
            func.max(s.mem_bytes),
        )
        .where(s.job_id == job_id)
        .group_by(s.job_id, b, s.rank)
    )
    session.execute(insert(r).from_select(columns, query))
    for level in range(1, len(ROLLUP_WIDTHS)):
        factor = ROLLUP_WIDTHS[level] // ROLLUP_WIDTHS[level - 1]
        b = (r.bin // literal(factor, Integer)).label("bin")
        query = (
            select(
                r.job_id,
                literal(level, Integer),
                b,
                r.rank,
                func.sum(r.n),
                func.sum(r.sum_duration),
                func.max(r.max_duration),
                func.sum(r.sum_compute),
                func.max(r.max_compute),
                func.sum(r.n_loss),
                func.sum(r.sum_loss),
                func.sum(r.n_nonfinite_loss),
                func.max(r.max_mem),
            )
            .where(r.job_id == job_id, r.level == level - 1)
            .group_by(r.job_id, b, r.rank)
        )
        session.execute(insert(r).from_select(columns, query))


# --- collective rollups ---------------------------------------------------------------------


_UPSERT_COLLECTIVES_PG = text(
    'INSERT INTO collective_rollups (job_id, level, bin, rank, "group", n, sum_bytes, '
    "sum_seconds) SELECT * FROM unnest(CAST(:job_id AS int[]), CAST(:level AS int[]), "
    "CAST(:bin AS bigint[]), CAST(:rank AS int[]), CAST(:group AS text[]), CAST(:n AS int[]), "
    "CAST(:sum_bytes AS float8[]), CAST(:sum_seconds AS float8[])) "
    'ON CONFLICT (job_id, level, bin, rank, "group") DO UPDATE SET '
    "n = collective_rollups.n + excluded.n, "
    "sum_bytes = collective_rollups.sum_bytes + excluded.sum_bytes, "
    "sum_seconds = collective_rollups.sum_seconds + excluded.sum_seconds"
)


def add_collective_rollups(
    *, session: Session, job_id: int, rank: int, records: list[dict[str, Any]]
) -> None:
    """Add one rank's collective records (ingest events) to their bins."""
    rows = collective_rollup_rows(job_id=job_id, rank=rank, records=records)
    upsert_collective_rollups(session=session, rows=rows)


def collective_rollup_rows(
    *, job_id: int, rank: int, records: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """One rank's collective records summed per bin and group: the rows to add."""
    sums: dict[tuple[int, int, str], list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    for e in records:
        step, seconds = e.get("step"), float(e["duration_s"])
        if step is None or not seconds > 0:
            continue  # what the raw bandwidth query leaves out too
        for level, width in enumerate(ROLLUP_WIDTHS):
            acc = sums[(level, step // width, e["group"])]
            acc[0] += 1
            acc[1] += float(e.get("bytes") or 0)
            acc[2] += seconds
    return [
        {
            "job_id": job_id,
            "level": level,
            "bin": b,
            "rank": rank,
            "group": group,
            "n": int(acc[0]),
            "sum_bytes": acc[1],
            "sum_seconds": acc[2],
        }
        for (level, b, group), acc in sums.items()
    ]


_COLLECTIVE_KEY = ("job_id", "level", "bin", "rank", "group")  # the unique index


def upsert_collective_rollups(*, session: Session, rows: list[dict[str, Any]]) -> None:
    """Add ``rows`` (:func:`collective_rollup_rows`, of any ranks and jobs) to the stored
    sums, as :func:`upsert_step_rollups` does."""
    for part in unique_rounds(rows, key=_COLLECTIVE_KEY):
        _upsert_collective_rollups(session, part)


def _upsert_collective_rollups(session: Session, rows: list[dict[str, Any]]) -> None:
    if session.get_bind().dialect.name == "postgresql":
        columns = {name: [row[name] for row in rows] for name in _COLLECTIVE_KEY}
        columns |= {name: [row[name] for row in rows] for name in ("n", "sum_bytes", "sum_seconds")}
        session.execute(_UPSERT_COLLECTIVES_PG, columns)
        return
    stmt = insert_for(session, CollectiveRollup)
    new, cur = stmt.excluded, CollectiveRollup.__table__.c
    stmt = stmt.on_conflict_do_update(
        index_elements=["job_id", "level", "bin", "rank", "group"],
        set_={
            "n": cur.n + new.n,
            "sum_bytes": cur.sum_bytes + new.sum_bytes,
            "sum_seconds": cur.sum_seconds + new.sum_seconds,
        },
    )
    session.execute(stmt, rows)


def rebuild_collective_rollups(*, session: Session, job_id: int) -> None:
    """Recompute the job's collective rollups from its records, in SQL."""
    session.execute(delete(CollectiveRollup).where(CollectiveRollup.job_id == job_id))
    c = CollectiveRecord
    for level, width in enumerate(ROLLUP_WIDTHS):
        b = c.step // literal(width, Integer)
        query = (
            select(
                c.job_id,
                literal(level, Integer),
                b,
                c.rank,
                c.group,
                func.count(),
                func.sum(cast(c.bytes, Double)),  # SQLite's integer sum() overflows at 2**63
                func.sum(c.duration_s),
            )
            .where(c.job_id == job_id, c.step.is_not(None), c.duration_s > 0)
            .group_by(c.job_id, b, c.rank, c.group)
        )
        columns = ["job_id", "level", "bin", "rank", "group", "n", "sum_bytes", "sum_seconds"]
        session.execute(insert(CollectiveRollup).from_select(columns, query))
    session.flush()
