"""Store one validated ingest batch: all of it in the caller's transaction, or none.

The hot path writes with Core bulk INSERTs (executemany), never one ORM object per row.
Idempotency: the batch row, unique per (job, ``batch_id``), is inserted first with ON
CONFLICT DO NOTHING; when it already exists, the batch is a retry and nothing else is
written, unless its content hash differs from the stored one: then it is refused (409).
Which launch of the job a batch belongs to is ``backend.jobs.launches``'s call.

Steps and collectives also go into their bins of the charts' rollups
(``backend.telemetry.rollups``), requests into the serving minutes
(``backend.telemetry.serving``) and their SLOs' minutes (``backend.slos.service``), in the
same transaction; a retried batch writes nothing, so nothing is counted twice.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from backend.actions.service import dispatch_for_rank, record_report
from backend.db import bulk_insert, insert_for
from backend.errors import Conflict
from backend.ingest.models import IngestBatch as IngestBatchRow
from backend.ingest.schemas import IngestBatch
from backend.ingest.shapes import add_shape_fingerprints, structure_hash
from backend.ingest.tokens import decode_raw
from backend.jobs.launches import Launch, follow_launch
from backend.jobs.rank_state import rank_values
from backend.slos.service import add_slo_minutes
from backend.telemetry.liveness import record_rank
from backend.telemetry.models import (
    CollectiveRecord,
    JobEvent,
    MetricPoint,
    OpSequence,
    ServingRequest,
    StepRecord,
)
from backend.telemetry.rollups import add_collective_rollups, add_step_rollups
from backend.telemetry.serving import add_serving_minutes


class BatchIdReused(Conflict):
    """A ``batch_id`` the job already stored came again with different content. Its own
    ``error`` code tells a collector that a version of this batch *is* stored: one that
    reuses an id only to resend (part of) a batch can take it as delivered."""

    code = "batch_id_reused"


@dataclass(frozen=True)
class IngestResult:
    job_id: int
    accepted: int
    duplicate: bool
    counts: dict[str, int]
    actions: list[dict[str, Any]] = field(default_factory=list)


def ingest_batch(
    *, session: Session, batch: IngestBatch, content_hash: str | None = None
) -> IngestResult:
    """Store ``batch``. ``content_hash`` (the view passes the SHA-256 of the decompressed
    body) tells a retry, stored once, from a reused ``batch_id`` with other content
    (``BatchIdReused``, a 409): a collector retries with the very same body."""
    launch = follow_launch(
        session=session,
        name=batch.job,
        kind=batch.kind,
        world_size=batch.world_size,
        attempt=batch.attempt,
        run=batch.run,
    )
    job_id = launch.job_id
    claimed = session.execute(
        insert_for(session, IngestBatchRow)
        .values(
            job_id=job_id,
            batch_id=batch.batch_id,
            content_hash=content_hash,
            rank=batch.rank,
            events=len(batch.events),
        )
        .on_conflict_do_nothing(index_elements=["job_id", "batch_id"])
        .returning(IngestBatchRow.batch_id)
    ).first()
    if claimed is None:
        _check_retry(session=session, job_id=job_id, batch=batch, content_hash=content_hash)
        actions = _dispatch(session=session, batch=batch, launch=launch)
        return IngestResult(job_id, len(batch.events), True, {}, actions)

    by_type: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for event in batch.events:
        by_type[event["type"]].append(event)  # type: ignore[arg-type]

    base = {"job_id": job_id, "rank": batch.rank}
    if steps := by_type.get("step"):
        bulk_insert(
            session, StepRecord.__table__, [_step_row(e, base, launch.stored) for e in steps]
        )
        add_step_rollups(session=session, job_id=job_id, rank=batch.rank, steps=steps)
        add_shape_fingerprints(session=session, job_id=job_id, rank=batch.rank, steps=steps)
    if colls := by_type.get("collective"):
        bulk_insert(
            session,
            CollectiveRecord.__table__,
            [_collective_row(e, base, launch.stored) for e in colls],
        )
        add_collective_rollups(session=session, job_id=job_id, rank=batch.rank, records=colls)
    if opseqs := by_type.get("opseq"):
        session.execute(
            insert_for(session, OpSequence).on_conflict_do_nothing(
                index_elements=["job_id", "hash"]
            ),
            [
                {
                    "job_id": job_id,
                    "hash": e["hash"],
                    "ops": e["ops"],
                    "first_rank": batch.rank,
                    "structure": structure_hash(op[0] for op in e["ops"]),
                    "profile": e.get("profile"),
                }
                for e in opseqs
            ],
        )
    if requests := by_type.get("request"):
        bulk_insert(session, ServingRequest.__table__, [_request_row(e, base) for e in requests])
        add_serving_minutes(session=session, job_id=job_id, requests=requests, host=batch.host)
        add_slo_minutes(session=session, job=batch.job, requests=requests)
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
    if launch.current:  # a lagging or stray batch does not touch the rank's live state
        _update_rank(
            session=session, batch=batch, job_id=job_id, by_type=by_type, attempt=launch.stored
        )
    actions = _dispatch(session=session, batch=batch, launch=launch)
    counts = {kind: len(events) for kind, events in by_type.items()}
    return IngestResult(job_id, len(batch.events), False, counts, actions)


def _check_retry(
    *, session: Session, job_id: int, batch: IngestBatch, content_hash: str | None
) -> None:
    stored = session.scalar(
        select(IngestBatchRow.content_hash).where(
            IngestBatchRow.job_id == job_id, IngestBatchRow.batch_id == batch.batch_id
        )
    )
    if content_hash is not None and stored is not None and stored != content_hash:
        raise BatchIdReused(
            f"batch_id {batch.batch_id!r} was already stored for job {batch.job!r} with "
            "different content; a retry must send the same body, new data a new batch_id",
            extra={"batch_id": batch.batch_id},
        )


def _dispatch(*, session: Session, batch: IngestBatch, launch: Launch) -> list[dict[str, Any]]:
    """Actions for the rank, when the batch is of the job's current launch (a stray attempt
    must neither receive nor close them)."""
    if not launch.current:
        return []
    return dispatch_for_rank(
        session=session, job_id=launch.job_id, rank=batch.rank, attempt=launch.attempt
    )


def _update_rank(
    *,
    session: Session,
    batch: IngestBatch,
    job_id: int,
    by_type: dict[str, list[dict[str, Any]]],
    attempt: int,
) -> None:
    """The rank's latest state, newer parts winning (``backend.jobs.rank_state``): in
    distributed mode to Redis, SQL's row refreshed at a low rate
    (``backend.telemetry.liveness``); in embedded mode to the row."""
    values = rank_values(
        job_id=job_id, rank=batch.rank, host=batch.host, attempt=attempt, by_type=by_type
    )
    record_rank(session=session, values=values)


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
        "shape_fp": e.get("shape_fp"),
        "swap_policy": e.get("swap_policy"),
        "swap_peak_bytes": e.get("swap_peak_bytes"),
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
    times = e.get("token_times")
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
        "queue_s": e.get("queue_s"),
        "model": e.get("model"),
        "replica": e.get("replica"),
        "token_stride": times.get("stride", 1) if times else None,
        "token_deltas": decode_raw(times["data"]) if times else None,
    }
