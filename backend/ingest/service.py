"""Store one validated ingest batch: all of it in the caller's transaction, or none.

The hot path writes with Core bulk INSERTs (executemany, ``COPY`` on PostgreSQL), never one
ORM object per row. Idempotency: the batch row, unique per (job, ``batch_id``), is inserted
first with ON CONFLICT DO NOTHING; when it already exists, the batch is a retry and nothing
else is written, unless its content hash differs from the stored one: then it is refused
(409). Which launch of the job a batch belongs to is ``backend.jobs.launches``'s call.
:func:`write_events` and :func:`update_ranks` take many claimed batches at once, so that
``backend.ingest.bulk`` stores a relay's request with a statement per table.

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
from backend.db import bulk_insert, insert_for, utcnow
from backend.errors import Conflict
from backend.ingest.models import IngestBatch as IngestBatchRow
from backend.ingest.schemas import IngestBatch
from backend.ingest.shapes import add_many_shape_fingerprints, structure_hash
from backend.ingest.tokens import decode_raw
from backend.jobs.launches import Launch, follow_launch
from backend.jobs.rank_state import rank_values
from backend.slos.service import add_slo_minutes
from backend.telemetry.liveness import record_ranks
from backend.telemetry.models import (
    CollectiveRecord,
    JobEvent,
    MetricPoint,
    OpSequence,
    ServingRequest,
    StepRecord,
)
from backend.telemetry.rollups import (
    collective_rollup_rows,
    step_rollup_rows,
    upsert_collective_rollups,
    upsert_step_rollups,
)
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


@dataclass(frozen=True)
class Claimed:
    """A batch whose ``batch_id`` the transaction claimed: its events are stored."""

    batch: IngestBatch
    launch: Launch
    by_type: dict[str, list[dict[str, Any]]]

    @classmethod
    def of(cls, batch: IngestBatch, launch: Launch) -> Claimed:
        by_type: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for event in batch.events:
            by_type[event["type"]].append(event)  # type: ignore[arg-type]
        return cls(batch, launch, dict(by_type))

    def result(self, actions: list[dict[str, Any]]) -> IngestResult:
        counts = {kind: len(events) for kind, events in self.by_type.items()}
        return IngestResult(self.launch.job_id, len(self.batch.events), False, counts, actions)


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
        .values(batch_row(batch, job_id, content_hash))
        .on_conflict_do_nothing(index_elements=["job_id", "batch_id"])
        .returning(IngestBatchRow.batch_id)
    ).first()
    if claimed is None:
        stored = session.scalar(
            select(IngestBatchRow.content_hash).where(
                IngestBatchRow.job_id == job_id, IngestBatchRow.batch_id == batch.batch_id
            )
        )
        check_retry(batch, stored=stored, content_hash=content_hash)
        actions = dispatch(session=session, batch=batch, launch=launch)
        return IngestResult(job_id, len(batch.events), True, {}, actions)

    new = Claimed.of(batch, launch)
    write_events(session=session, batches=[new])
    for report in new.by_type.get("action", ()):
        record_report(
            session=session,
            job_id=job_id,
            rank=batch.rank,
            world_size=batch.world_size,
            action_id=report["id"],
            state=report["state"],
            result=report.get("result"),
        )
    update_ranks(session=session, batches=[new])
    return new.result(dispatch(session=session, batch=batch, launch=launch))


def batch_row(batch: IngestBatch, job_id: int, content_hash: str | None) -> dict[str, Any]:
    """The batch's ``ingest_batches`` row, which claims its ``batch_id``."""
    return {
        "job_id": job_id,
        "batch_id": batch.batch_id,
        "content_hash": content_hash,
        "rank": batch.rank,
        "events": len(batch.events),
        "received_at": utcnow(),
    }


def check_retry(batch: IngestBatch, *, stored: str | None, content_hash: str | None) -> None:
    """A batch whose ``batch_id`` is stored already, with hash ``stored``: a retry (the
    same content, or a hash not known), or ``BatchIdReused``."""
    if content_hash is not None and stored is not None and stored != content_hash:
        raise BatchIdReused(
            f"batch_id {batch.batch_id!r} was already stored for job {batch.job!r} with "
            "different content; a retry must send the same body, new data a new batch_id",
            extra={"batch_id": batch.batch_id},
        )


def write_events(*, session: Session, batches: list[Claimed]) -> None:
    """Store the claimed batches' events (all but action reports), in the order the
    batches came: one bulk INSERT (``COPY`` on PostgreSQL) or upsert per table however
    many batches there are (``/ingest/multi`` passes a request's), the rollups too."""
    steps: list[dict[str, Any]] = []
    step_sums: list[dict[str, Any]] = []
    colls: list[dict[str, Any]] = []
    coll_sums: list[dict[str, Any]] = []
    opseqs: dict[tuple[int, str], dict[str, Any]] = {}
    requests: list[dict[str, Any]] = []
    metrics: list[dict[str, Any]] = []
    named: list[dict[str, Any]] = []
    for c in batches:
        job_id, rank, attempt = c.launch.job_id, c.batch.rank, c.launch.stored
        base = {"job_id": job_id, "rank": rank}
        if events := c.by_type.get("step"):
            steps += [_step_row(e, base, attempt) for e in events]
            step_sums += step_rollup_rows(job_id=job_id, rank=rank, steps=events)
        if events := c.by_type.get("collective"):
            colls += [_collective_row(e, base, attempt) for e in events]
            coll_sums += collective_rollup_rows(job_id=job_id, rank=rank, records=events)
        for e in c.by_type.get("opseq", ()):
            opseqs.setdefault((job_id, e["hash"]), _opseq_row(e, job_id, rank))  # first wins
        requests += [_request_row(e, base) for e in c.by_type.get("request", ())]
        metrics += [_metric_row(e, base) for e in c.by_type.get("metric", ())]
        named += [_event_row(e, base) for e in c.by_type.get("event", ())]
    if steps:
        bulk_insert(session, StepRecord.__table__, steps)
        upsert_step_rollups(session=session, rows=step_sums)
        add_many_shape_fingerprints(
            session=session,
            batches=[
                (c.launch.job_id, c.batch.rank, c.by_type["step"])
                for c in batches
                if "step" in c.by_type
            ],
        )
    if colls:
        bulk_insert(session, CollectiveRecord.__table__, colls)
        upsert_collective_rollups(session=session, rows=coll_sums)
    if opseqs:
        session.execute(
            insert_for(session, OpSequence).on_conflict_do_nothing(
                index_elements=["job_id", "hash"]
            ),
            list(opseqs.values()),
        )
    bulk_insert(session, ServingRequest.__table__, requests)
    for c in batches:
        if events := c.by_type.get("request"):
            add_serving_minutes(
                session=session, job_id=c.launch.job_id, requests=events, host=c.batch.host
            )
            add_slo_minutes(session=session, job=c.batch.job, requests=events)
    bulk_insert(session, MetricPoint.__table__, metrics)
    bulk_insert(session, JobEvent.__table__, named)


def update_ranks(*, session: Session, batches: list[Claimed]) -> None:
    """The latest state of the batches' ranks, newer parts winning
    (``backend.jobs.rank_state``): in distributed mode to Redis, SQL's row refreshed at a
    low rate (``backend.telemetry.liveness``); in embedded mode to the row. A lagging or
    stray batch (not of the job's current launch) does not touch its rank's live state."""
    states = [
        rank_values(
            job_id=c.launch.job_id,
            rank=c.batch.rank,
            host=c.batch.host,
            attempt=c.launch.stored,
            by_type=c.by_type,
        )
        for c in batches
        if c.launch.current
    ]
    record_ranks(session=session, states=states)


def dispatch(*, session: Session, batch: IngestBatch, launch: Launch) -> list[dict[str, Any]]:
    """Actions for the rank, when the batch is of the job's current launch (a stray attempt
    must neither receive nor close them)."""
    if not launch.current:
        return []
    return dispatch_for_rank(
        session=session, job_id=launch.job_id, rank=batch.rank, attempt=launch.attempt
    )


def _opseq_row(e: dict[str, Any], job_id: int, rank: int) -> dict[str, Any]:
    return {
        "job_id": job_id,
        "hash": e["hash"],
        "ops": e["ops"],
        "first_rank": rank,
        "structure": structure_hash(op[0] for op in e["ops"]),
        "profile": e.get("profile"),
    }


def _metric_row(e: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    return {
        **base,
        "name": e["name"],
        "value": e["value"],
        "step": e.get("step"),
        "ts": e.get("ts"),
    }


def _event_row(e: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    return {
        **base,
        "name": e["name"],
        "step": e.get("step"),
        "ts": e.get("ts"),
        "attrs": e.get("attrs") or {},
    }


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
