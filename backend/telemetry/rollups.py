"""Collective rollups: each rank's collective bytes and seconds summed per step bin of
every level of ``ROLLUP_WIDTHS`` and per process group, in the ingest transaction that
stores the records. Sums only, so bandwidth over any set of bins is exact:
``sum(sum_bytes) / sum(sum_seconds)``.

    add_collective_rollups(session=s, job_id=7, rank=3, records=[{"step": 120,
        "group": "dp", "bytes": 4194304, "duration_s": 0.012}, …])
    rebuild_collective_rollups(session=s, job_id=7)   # after loading around ingest
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from sqlalchemy import Integer, delete, func, insert, literal, select, text
from sqlalchemy.orm import Session

from backend.db import insert_for
from backend.telemetry.models import ROLLUP_WIDTHS, CollectiveRecord, CollectiveRollup

_UPSERT_PG = text(
    'INSERT INTO collective_rollups (job_id, rank, level, bin, "group", n, sum_bytes, '
    "sum_seconds) SELECT :job_id, :rank, * FROM unnest(CAST(:level AS int[]), "
    "CAST(:bin AS bigint[]), CAST(:group AS text[]), CAST(:n AS int[]), "
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
    if not sums:
        return
    keys = sorted(sums)  # one lock order for every writer: no deadlocks
    rows: dict[str, list[Any]] = {
        "level": [k[0] for k in keys],
        "bin": [k[1] for k in keys],
        "group": [k[2] for k in keys],
        "n": [int(sums[k][0]) for k in keys],
        "sum_bytes": [sums[k][1] for k in keys],
        "sum_seconds": [sums[k][2] for k in keys],
    }
    if session.get_bind().dialect.name == "postgresql":
        session.execute(_UPSERT_PG, {"job_id": job_id, "rank": rank, **rows})
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
    session.execute(
        stmt,
        [
            {"job_id": job_id, "rank": rank, **{name: rows[name][i] for name in rows}}
            for i in range(len(keys))
        ],
    )


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
                func.sum(c.bytes),
                func.sum(c.duration_s),
            )
            .where(c.job_id == job_id, c.step.is_not(None), c.duration_s > 0)
            .group_by(c.job_id, b, c.rank, c.group)
        )
        columns = ["job_id", "level", "bin", "rank", "group", "n", "sum_bytes", "sum_seconds"]
        session.execute(insert(CollectiveRollup).from_select(columns, query))
    session.flush()
