"""Store one validated ingest batch: all of it in the caller's transaction, or none.

The hot path writes with Core bulk INSERTs (executemany), never one ORM object per row.
Idempotency: the batch row is inserted first with ON CONFLICT DO NOTHING; when it already
exists, the batch is a retry and nothing else is written.

Steps also go into their bins of ``step_rollups`` (the charts' downsampling pyramid), in the
same transaction: the batch is summed per bin here, then one upsert per bin adds it to the
stored sums, so 5,000 steps cost about 420 upserted rows over all levels. A retried batch
writes nothing, so nothing is counted twice. ``rebuild_rollups`` recomputes a job's rollups
from its steps (data loaded around ingest, e.g. with ``COPY``).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Integer, case, delete, func, insert, literal, select, text, update
from sqlalchemy.orm import Session

from backend.actions.service import dispatch_for_rank, record_report
from backend.db import bulk_insert, insert_for, utcnow
from backend.ingest.models import IngestBatch as IngestBatchRow
from backend.ingest.schemas import IngestBatch
from backend.jobs.models import Job, Rank
from backend.telemetry.models import (
    ROLLUP_WIDTHS,
    CollectiveRecord,
    JobEvent,
    MetricPoint,
    OpSequence,
    ServingRequest,
    StepRecord,
    StepRollup,
)
from backend.telemetry.rollups import add_collective_rollups, rebuild_collective_rollups

FINITE = 1e300  # a loss counts in the rollups' mean when |loss| <= this (NaN, ±Inf don't)


class JobKindConflict(Exception):
    """The batch names an existing job but disagrees on its kind."""


@dataclass(frozen=True)
class IngestResult:
    job_id: int
    accepted: int
    duplicate: bool
    counts: dict[str, int]
    actions: list[dict[str, Any]] = field(default_factory=list)


def ingest_batch(*, session: Session, batch: IngestBatch) -> IngestResult:
    job_id = _ensure_job(session=session, batch=batch)
    claimed = session.execute(
        insert_for(session, IngestBatchRow)
        .values(batch_id=batch.batch_id, job_id=job_id, rank=batch.rank, events=len(batch.events))
        .on_conflict_do_nothing(index_elements=["batch_id"])
        .returning(IngestBatchRow.batch_id)
    ).first()
    if claimed is None:
        actions = dispatch_for_rank(
            session=session, job_id=job_id, rank=batch.rank, attempt=batch.attempt
        )
        return IngestResult(job_id, len(batch.events), True, {}, actions)

    by_type: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for event in batch.events:
        by_type[event["type"]].append(event)  # type: ignore[arg-type]

    base = {"job_id": job_id, "rank": batch.rank}
    if steps := by_type.get("step"):
        bulk_insert(
            session, StepRecord.__table__, [_step_row(e, base, batch.attempt) for e in steps]
        )
        add_rollups(session=session, job_id=job_id, rank=batch.rank, steps=steps)
    if colls := by_type.get("collective"):
        bulk_insert(
            session,
            CollectiveRecord.__table__,
            [_collective_row(e, base, batch.attempt) for e in colls],
        )
        add_collective_rollups(session=session, job_id=job_id, rank=batch.rank, records=colls)
    if opseqs := by_type.get("opseq"):
        session.execute(
            insert_for(session, OpSequence).on_conflict_do_nothing(
                index_elements=["job_id", "hash"]
            ),
            [
                {"job_id": job_id, "hash": e["hash"], "ops": e["ops"], "first_rank": batch.rank}
                for e in opseqs
            ],
        )
    if requests := by_type.get("request"):
        bulk_insert(session, ServingRequest.__table__, [_request_row(e, base) for e in requests])
    if metrics := by_type.get("metric"):
        bulk_insert(
            session,
            MetricPoint.__table__,
            [
                {
                    **base,
                    "name": e["name"],
                    "value": e["value"],
                    "step": e.get("step"),
                    "ts": e.get("ts"),
                }
                for e in metrics
            ],
        )
    if named := by_type.get("event"):
        bulk_insert(
            session,
            JobEvent.__table__,
            [
                {
                    **base,
                    "name": e["name"],
                    "step": e.get("step"),
                    "ts": e.get("ts"),
                    "attrs": e.get("attrs") or {},
                }
                for e in named
            ],
        )
    for report in by_type.get("action", ()):
        record_report(
            session=session,
            job_id=job_id,
            rank=batch.rank,
            world_size=batch.world_size,
            action_id=report["id"],
            state=report["state"],
            result=report.get("result"),
        )
    _update_rank(session=session, batch=batch, job_id=job_id, by_type=by_type)
    actions = dispatch_for_rank(
        session=session, job_id=job_id, rank=batch.rank, attempt=batch.attempt
    )
    counts = {kind: len(events) for kind, events in by_type.items()}
    return IngestResult(job_id, len(batch.events), False, counts, actions)


def _ensure_job(*, session: Session, batch: IngestBatch) -> int:
    """Find or create the job. Its row is only written when something about it grows,
    so concurrent batches from many ranks do not queue on one row lock."""
    row = session.execute(
        select(Job.id, Job.kind, Job.world_size, Job.attempt).where(Job.name == batch.job)
    ).first()
    if row is None:
        session.execute(
            insert_for(session, Job)
            .values(
                name=batch.job,
                kind=batch.kind,
                world_size=batch.world_size,
                attempt=batch.attempt,
                created_at=utcnow(),
            )
            .on_conflict_do_nothing(index_elements=["name"])
        )
        row = session.execute(
            select(Job.id, Job.kind, Job.world_size, Job.attempt).where(Job.name == batch.job)
        ).one()
    job_id, kind, world_size, attempt = row
    if kind != batch.kind:
        raise JobKindConflict(
            f"job {batch.job!r} is a {kind} job; this batch says kind={batch.kind!r}"
        )
    if batch.world_size != world_size or batch.attempt > attempt:
        # A restart may change the world size (elastic jobs, evicted ranks).
        session.execute(
            update(Job)
            .where(Job.id == job_id)
            .values(
                world_size=batch.world_size if batch.attempt >= attempt else world_size,
                attempt=max(attempt, batch.attempt),
            )
        )
    return int(job_id)


def _update_rank(
    *, session: Session, batch: IngestBatch, job_id: int, by_type: dict[str, list[dict[str, Any]]]
) -> None:
    """Upsert the rank's latest state; newer timestamps win, so a late batch never
    overwrites fresher state."""
    values: dict[str, Any] = {
        "job_id": job_id,
        "rank": batch.rank,
        "host": batch.host,
        "attempt": batch.attempt,
        "last_seen_at": utcnow(),
        "last_step": None,
        "last_step_ts": None,
        "current_step": None,
        "last_heartbeat_ts": None,
        "inflight": None,
        "pid": None,
        "drops": None,
        "exited": False,
    }
    if steps := by_type.get("step"):
        latest = max(steps, key=lambda e: e["ts"])
        values["last_step"], values["last_step_ts"] = latest["step"], latest["ts"]
    if beats := by_type.get("heartbeat"):
        latest = max(beats, key=lambda e: e["ts"])
        values["last_heartbeat_ts"] = latest["ts"]
        values["current_step"] = latest.get("step")
        values["inflight"] = latest.get("inflight")
        values["pid"] = latest.get("pid")
        values["drops"] = latest.get("dropped")
        values["exited"] = bool(latest.get("exiting", False))

    stmt = insert_for(session, Rank).values(**values)
    new, cur = stmt.excluded, Rank.__table__.c
    newer_step = (new.last_step_ts.is_not(None)) & (
        cur.last_step_ts.is_(None) | (new.last_step_ts >= cur.last_step_ts)
    )
    newer_beat = (new.last_heartbeat_ts.is_not(None)) & (
        cur.last_heartbeat_ts.is_(None) | (new.last_heartbeat_ts >= cur.last_heartbeat_ts)
    )
    stmt = stmt.on_conflict_do_update(
        index_elements=["job_id", "rank"],
        set_={
            "host": new.host,
            "attempt": new.attempt,
            "last_seen_at": new.last_seen_at,
            "last_step": case((newer_step, new.last_step), else_=cur.last_step),
            "last_step_ts": case((newer_step, new.last_step_ts), else_=cur.last_step_ts),
            "current_step": case((newer_beat, new.current_step), else_=cur.current_step),
            "inflight": case((newer_beat, new.inflight), else_=cur.inflight),
            "pid": case((newer_beat, new.pid), else_=cur.pid),
            "drops": case((newer_beat, new.drops), else_=cur.drops),
            "exited": case((newer_beat, new.exited), else_=cur.exited),
            "last_heartbeat_ts": case(
                (newer_beat, new.last_heartbeat_ts), else_=cur.last_heartbeat_ts
            ),
        },
    )
    session.execute(stmt)


def add_rollups(*, session: Session, job_id: int, rank: int, steps: list[dict[str, Any]]) -> None:
    """Add one rank's step events to their bins of every rollup level."""
    # [n, sum_duration, max_duration, sum_compute, max_compute, n_loss, sum_loss,
    #  n_nonfinite_loss, max_mem] per bin, finest level first, coarser ones from it.
    finest: dict[int, list[Any]] = {}
    width = ROLLUP_WIDTHS[0]
    for e in steps:
        duration = float(e["duration_s"])
        compute = duration - float(e.get("comm_s") or 0.0)
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
            for b, acc in sorted(level_bins.items())  # one lock order: no deadlocks
        )
    if session.get_bind().dialect.name == "postgresql":
        # One statement with a column of arrays: a round trip per batch, not per row.
        columns = {name: [row[name] for row in rows] for name in _ROLLUP_ARRAYS}
        session.execute(_UPSERT_PG, {"job_id": job_id, "rank": rank, **columns})
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
    "level": "int[]",
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
_UPSERT_PG = text(
    f"INSERT INTO step_rollups (job_id, rank, {', '.join(_ROLLUP_ARRAYS)}) "
    f"SELECT :job_id, :rank, * FROM unnest("
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


def rebuild_rollups(*, session: Session, job_id: int) -> None:
    """Recompute the job's ``step_rollups`` from its ``steps`` (in SQL, one pass over the
    steps for the finest level, then each level from the one below), and its collective
    rollups."""
    session.execute(delete(StepRollup).where(StepRollup.job_id == job_id))
    r, s = StepRollup, StepRecord
    finite = s.loss.between(-FINITE, FINITE)
    compute = s.duration_s - func.coalesce(s.comm_s, 0.0)
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
    rebuild_collective_rollups(session=session, job_id=job_id)


def _step_row(e: dict[str, Any], base: dict[str, Any], attempt: int) -> dict[str, Any]:
    return {
        **base,
        "attempt": attempt,
        "step": e["step"],
        "ts": e["ts"],
        "duration_s": e["duration_s"],
        "comm_s": e.get("comm_s"),
        "data_s": e.get("data_s"),
        "loss": e.get("loss"),
        "grad_norm": e.get("grad_norm"),
        "mem_bytes": e.get("mem_bytes"),
        "tokens": e.get("tokens"),
        "opseq": e.get("opseq"),
    }


def _collective_row(e: dict[str, Any], base: dict[str, Any], attempt: int) -> dict[str, Any]:
    return {
        **base,
        "attempt": attempt,
        "step": e.get("step"),
        "group": e["group"],
        "op": e["op"],
        "seq": e.get("seq"),
        "bytes": e.get("bytes", 0),
        "duration_s": e["duration_s"],
        "count": e.get("count", 1),
        "members": e.get("members"),
    }


def _request_row(e: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    return {
        **base,
        "request_id": e["id"],
        "arrival": e["arrival"],
        "first_token": e.get("first_token"),
        "end": e.get("end"),
        "prompt_tokens": e.get("prompt_tokens"),
        "output_tokens": e.get("output_tokens"),
        "max_tbt_s": e.get("max_tbt_s"),
        "status": e.get("status", "ok"),
    }
