"""Store many ingest batches in the caller's transaction, in bulk: a per-host relay's
request (``/api/v1/ingest/multi``), each batch answered and stored as it would be alone,
one after another (``backend.ingest.service.ingest_batch``), at a fraction of the cost.

The common batch is of its job's current launch (``backend.jobs.launches.current_launch``,
from one read of the request's job rows). A run of such batches is stored together:

- their ``batch_id`` claims in one multi-row INSERT … ON CONFLICT DO NOTHING (the first of
  the request's batches with an id claims it; the hashes of ids already stored are read in
  one query), so a retry is a duplicate and another body under a stored id a 409, as alone;
- their events with one bulk INSERT (``COPY``) or upsert per table, rollups included
  (``backend.ingest.service.write_events``);
- their ranks' state in one statement, or one Redis round trip in distributed mode
  (``update_ranks``);
- their actions: one query finds the jobs with an open action; only those batches' ranks
  are handed theirs (``dispatch_for_rank``), in order.

Any other batch (the first of a new job or launch, a restart, a lagging rank, a new world
size, a report on an action) ends the run: the run is stored, then that batch alone, in a
savepoint, so a refusal (a 409) takes back nothing but its own; the job's row is read
again after it. The caller commits; nothing is answered before that.

    outcomes = ingest_batches(session=s, batches=[(batch, sha256_hex), …])
    outcomes[0]   # IngestResult, or the DomainError that batch alone would raise
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from backend.actions.service import jobs_with_open_actions
from backend.db import insert_for
from backend.errors import DomainError
from backend.ingest.models import IngestBatch as IngestBatchRow
from backend.ingest.schemas import IngestBatch
from backend.ingest.service import (
    Claimed,
    IngestResult,
    batch_row,
    check_retry,
    dispatch,
    ingest_batch,
    update_ranks,
    write_events,
)
from backend.jobs.launches import JobRow, Launch, current_launch, read_jobs

Outcome = IngestResult | DomainError
Key = tuple[int, str]  # (job id, batch_id)


@dataclass(frozen=True)
class _Common:
    """A batch of its job's current launch, waiting to be stored with its run."""

    index: int
    batch: IngestBatch
    digest: str
    launch: Launch

    @property
    def key(self) -> Key:
        return self.launch.job_id, self.batch.batch_id


def ingest_batches(*, session: Session, batches: list[tuple[IngestBatch, str]]) -> list[Outcome]:
    """Store ``batches`` (each with the SHA-256 of its body), in order, in the session's
    transaction; one outcome per batch: its result, or the error it was refused with
    (nothing of it stored). Anything else raised leaves the transaction to roll back."""
    jobs: dict[str, JobRow | None] = dict.fromkeys((b.job for b, _ in batches), None)
    jobs |= read_jobs(session=session, names=jobs)
    out: list[Outcome | None] = [None] * len(batches)
    run: list[_Common] = []
    for index, (batch, digest) in enumerate(batches):
        launch = _common(session, jobs, batch)
        if launch is not None:
            run.append(_Common(index, batch, digest, launch))
            continue
        _store_run(session, run, out)
        run = []
        out[index] = _alone(session, batch, digest)
        jobs.pop(batch.job)  # it may have moved the job: read its row again
    _store_run(session, run, out)
    assert all(o is not None for o in out)
    return out  # type: ignore[return-value]


def _common(session: Session, jobs: dict[str, JobRow | None], batch: IngestBatch) -> Launch | None:
    if any(e["type"] == "action" for e in batch.events):
        return None  # reports change actions that the batches before it are handed
    if batch.job not in jobs:
        jobs[batch.job] = read_jobs(session=session, names=[batch.job]).get(batch.job)
    row = jobs[batch.job]
    if row is None:
        return None
    return current_launch(
        row, kind=batch.kind, world_size=batch.world_size, attempt=batch.attempt, run=batch.run
    )


def _alone(session: Session, batch: IngestBatch, digest: str) -> Outcome:
    try:
        with session.begin_nested():
            return ingest_batch(session=session, batch=batch, content_hash=digest)
    except DomainError as exc:
        return exc


def _store_run(session: Session, run: list[_Common], out: list[Outcome | None]) -> None:
    if not run:
        return
    claimed, stored = _claim(session, run)
    new: list[Claimed] = []
    answered: list[tuple[_Common, Claimed | None]] = []
    for item in run:
        if claimed.get(item.key) == item.index:
            new.append(Claimed.of(item.batch, item.launch))
            answered.append((item, new[-1]))
            continue
        try:
            check_retry(item.batch, stored=stored.get(item.key), content_hash=item.digest)
        except DomainError as exc:
            out[item.index] = exc
            continue
        answered.append((item, None))
    write_events(session=session, batches=new)
    update_ranks(session=session, batches=new)
    with_actions = jobs_with_open_actions(
        session=session, job_ids=(item.launch.job_id for item, _ in answered)
    )
    for item, fresh in answered:
        actions: list[dict[str, Any]] = []
        if item.launch.job_id in with_actions:
            actions = dispatch(session=session, batch=item.batch, launch=item.launch)
        if fresh is not None:
            out[item.index] = fresh.result(actions)
        else:
            out[item.index] = IngestResult(
                item.launch.job_id, len(item.batch.events), True, {}, actions
            )


def _claim(session: Session, run: list[_Common]) -> tuple[dict[Key, int], dict[Key, str | None]]:
    """Claim the run's batch ids in one statement. Returns which batch (its index) claimed
    each id, and the content hash stored under each id of the run."""
    first: dict[Key, _Common] = {}
    for item in run:
        first.setdefault(item.key, item)
    # In key order: concurrent requests with ids in common (a relay's retry) claim them in
    # one order, never in a deadlock.
    rows = [batch_row(first[k].batch, k[0], first[k].digest) for k in sorted(first)]
    t = IngestBatchRow.__table__.c
    inserted = session.execute(  # one statement however many rows ("insertmanyvalues")
        insert_for(session, IngestBatchRow)
        .on_conflict_do_nothing(index_elements=["job_id", "batch_id"])
        .returning(t.job_id, t.batch_id),
        rows,
    )
    claimed = {(job_id, batch_id): first[(job_id, batch_id)].index for job_id, batch_id in inserted}
    stored: dict[Key, str | None] = {key: first[key].digest for key in claimed}
    others = [key for key in first if key not in claimed]
    if others:
        query = select(t.job_id, t.batch_id, t.content_hash).where(
            t.job_id.in_(sorted({job_id for job_id, _ in others})),
            t.batch_id.in_(sorted({batch_id for _, batch_id in others})),
        )
        for job_id, batch_id, content_hash in session.execute(query):
            if (job_id, batch_id) in first:
                stored[(job_id, batch_id)] = content_hash
    return claimed, stored
