"""Append-only telemetry: step records, collectives, op sequences, serving requests,
metrics and free-form events. Written in bulk by ingest, read by detectors and the API.
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Double,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column

from backend.db import Base, BigId, NonFiniteFloat, UTCDateTime, utcnow


class StepRecord(Base):
    """One step of one rank. On PostgreSQL the table is partitioned by day on ``ts`` (its
    key there is ``(id, ts)``; BRIN on ``ts``), and days older than
    ``VIGIL_RAW_RETENTION_DAYS`` are dropped whole (``backend.telemetry.partitions``)."""

    __tablename__ = "steps"
    __table_args__ = (
        Index("ix_steps_job_step", "job_id", "step", "rank"),
        Index("ix_steps_job_rank_step", "job_id", "rank", "step"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    # No foreign key: the hottest append-only table; checking it per row costs Postgres as
    # much as both indexes (bench/README.md). Rows go when their job is deleted, in code.
    job_id: Mapped[int] = mapped_column(Integer)
    rank: Mapped[int] = mapped_column(Integer)
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    step: Mapped[int] = mapped_column(BigInteger)
    ts: Mapped[float] = mapped_column(Double)
    duration_s: Mapped[float] = mapped_column(Double)
    comm_s: Mapped[float | None] = mapped_column(Double)
    data_s: Mapped[float | None] = mapped_column(Double)
    loss: Mapped[float | None] = mapped_column(NonFiniteFloat)
    grad_norm: Mapped[float | None] = mapped_column(NonFiniteFloat)
    mem_bytes: Mapped[int | None] = mapped_column(BigInteger)
    tokens: Mapped[int | None] = mapped_column(BigInteger)
    opseq: Mapped[str | None] = mapped_column(String(64))
    # The step's structural fingerprint (modules and shapes), every step (collector shape_fp.py).
    shape_fp: Mapped[str | None] = mapped_column(String(64))
    # The activation-swap policy version the step ran under, and the peak it measured.
    swap_policy: Mapped[int | None] = mapped_column(Integer)
    swap_peak_bytes: Mapped[int | None] = mapped_column(BigInteger)


# Bin widths (steps) of the step rollups, finest first; each divides the next.
ROLLUP_WIDTHS = (16, 64, 256, 1024, 4096)

# A loss counts as finite where ``-FINITE <= loss <= FINITE``: NaN and ±Inf don't (NaN is
# text on SQLite and above every number on Postgres, so ``BETWEEN`` leaves it out on both).
# 1e290: a bin counts at most 2**31 losses (its INTEGER ``n``), and 2**31 × 1e290 is far
# below the largest double, so a rollup's ``sum_loss`` can never overflow.
FINITE = 1e290


class StepRollup(Base):
    """A downsampling pyramid of ``steps``: one row per (job, level, step bin, rank),
    kept by ingest in the transaction that stores the steps (``backend.telemetry.rollups``).
    Level ``i`` bins steps ``bin × w … bin × w + w − 1`` with ``w = ROLLUP_WIDTHS[i]``, so
    a chart over 10⁷ step rows reads 10⁴–10⁵ rollup rows instead::

        # mean compute time of rank 3 over steps 256…511
        row.sum_compute / row.n   # where level=2, bin=1, rank=3
    """

    __tablename__ = "step_rollups"

    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    level: Mapped[int] = mapped_column(Integer, primary_key=True)
    bin: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    rank: Mapped[int] = mapped_column(Integer, primary_key=True)
    n: Mapped[int] = mapped_column(Integer)  # step rows
    sum_duration: Mapped[float] = mapped_column(Double)
    max_duration: Mapped[float] = mapped_column(Double)
    sum_compute: Mapped[float] = mapped_column(Double)  # compute time (telemetry.timing)
    max_compute: Mapped[float] = mapped_column(Double)
    n_loss: Mapped[int] = mapped_column(Integer)  # finite losses
    sum_loss: Mapped[float] = mapped_column(Double)
    n_nonfinite_loss: Mapped[int] = mapped_column(Integer)
    max_mem: Mapped[int | None] = mapped_column(BigInteger)


class CollectiveRollup(Base):
    """The same pyramid for ``collectives``: bytes and seconds per (job, level, step bin,
    rank, group), kept by ingest (``backend.telemetry.rollups``), so the bandwidth chart
    of a big job reads sums, not millions of records."""

    __tablename__ = "collective_rollups"

    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    level: Mapped[int] = mapped_column(Integer, primary_key=True)
    bin: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    rank: Mapped[int] = mapped_column(Integer, primary_key=True)
    group: Mapped[str] = mapped_column(String(128), primary_key=True)
    n: Mapped[int] = mapped_column(Integer)  # collective records
    sum_bytes: Mapped[float] = mapped_column(Double)
    sum_seconds: Mapped[float] = mapped_column(Double)


class CollectiveRecord(Base):
    """Collective calls of one rank, aggregated per step and (group, op). Partitioned by
    day on ``ts`` on PostgreSQL, as ``steps`` is."""

    __tablename__ = "collectives"
    __table_args__ = (Index("ix_collectives_job_step", "job_id", "step", "rank"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    # No foreign key: the hottest append-only table; checking it per row costs Postgres as
    # much as both indexes (bench/README.md). Rows go when their job is deleted, in code.
    job_id: Mapped[int] = mapped_column(Integer)
    rank: Mapped[int] = mapped_column(Integer)
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    step: Mapped[int | None] = mapped_column(BigInteger)
    group: Mapped[str] = mapped_column(String(128))
    op: Mapped[str] = mapped_column(String(64))
    seq: Mapped[int | None] = mapped_column(BigInteger)
    bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    duration_s: Mapped[float] = mapped_column(Double)
    count: Mapped[int] = mapped_column(Integer, default=1)
    # Member ranks of the process group; NULL for the default (world) group.
    members: Mapped[list[int] | None] = mapped_column(JSON)
    # When the server stored the record (epoch s; not in the ingest contract): the time the
    # partitions and retention go by. Filled here on inserts through SQLAlchemy, and by
    # the column's default (the transaction's time) on PostgreSQL's COPY (migration 0014).
    ts: Mapped[float] = mapped_column(Double, default=time.time)


class OpSequence(Base):
    """The full operator sequence behind a fingerprint, stored once per job."""

    __tablename__ = "opseqs"
    __table_args__ = (UniqueConstraint("job_id", "hash"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    hash: Mapped[str] = mapped_column(String(64))
    ops: Mapped[list[Any]] = mapped_column(JSON)
    first_rank: Mapped[int] = mapped_column(Integer)
    first_seen_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    # The op names alone, hashed: equal structure with a new hash is a shape change.
    structure: Mapped[str | None] = mapped_column(String(64))
    # The profiled step shipped with the sequence (PROFILE of ``detectors.swap``), if any.
    profile: Mapped[dict[str, Any] | None] = mapped_column(JSON)


class ServingRequest(Base):
    __tablename__ = "requests"
    __table_args__ = (Index("ix_requests_job_arrival", "job_id", "arrival"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    rank: Mapped[int] = mapped_column(Integer)
    request_id: Mapped[str] = mapped_column(String(128))
    arrival: Mapped[float] = mapped_column(Double)
    first_token: Mapped[float | None] = mapped_column(Double)
    end: Mapped[float | None] = mapped_column(Double)
    prompt_tokens: Mapped[int | None] = mapped_column(Integer)
    output_tokens: Mapped[int | None] = mapped_column(Integer)
    max_tbt_s: Mapped[float | None] = mapped_column(Double)
    status: Mapped[str] = mapped_column(String(32), default="ok")
    queue_s: Mapped[float | None] = mapped_column(Double)
    model: Mapped[str | None] = mapped_column(String(128))
    replica: Mapped[str | None] = mapped_column(String(128))
    # Token delivery times, as sent (``dv1``: LEB128 deltas of 100 µs from first_token, of
    # every ``token_stride``-th token); decoded by ``backend.ingest.tokens``.
    token_stride: Mapped[int | None] = mapped_column(Integer)
    token_deltas: Mapped[bytes | None] = mapped_column(LargeBinary)


class ServingMinute(Base):
    """Per-minute sums of a serving job's requests, per replica, kept by ingest: what the
    serving detectors and the serving page read instead of raw requests. Requests count in
    the minute they ended (``arrivals`` in the minute they arrived)."""

    __tablename__ = "serving_minutes"

    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    replica: Mapped[str] = mapped_column(String(200), primary_key=True)  # "model/replica"
    minute: Mapped[int] = mapped_column(BigInteger, primary_key=True)  # epoch seconds // 60
    requests: Mapped[int] = mapped_column(Integer, default=0)
    errors: Mapped[int] = mapped_column(Integer, default=0)
    arrivals: Mapped[int] = mapped_column(Integer, default=0)
    output_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    ttft_sum: Mapped[float] = mapped_column(Double, default=0.0)
    ttft_n: Mapped[int] = mapped_column(Integer, default=0)
    tpot_sum: Mapped[float] = mapped_column(Double, default=0.0)
    tpot_n: Mapped[int] = mapped_column(Integer, default=0)
    queue_sum: Mapped[float] = mapped_column(Double, default=0.0)
    queue_n: Mapped[int] = mapped_column(Integer, default=0)


class MetricPoint(Base):
    __tablename__ = "metrics"
    __table_args__ = (Index("ix_metrics_job_name_step", "job_id", "name", "step"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    rank: Mapped[int] = mapped_column(Integer)
    name: Mapped[str] = mapped_column(String(128))
    value: Mapped[float] = mapped_column(NonFiniteFloat)
    step: Mapped[int | None] = mapped_column(BigInteger)
    ts: Mapped[float | None] = mapped_column(Double)


class JobEvent(Base):
    """Named, free-form events (checkpoint saved, stacks dumped, …)."""

    __tablename__ = "job_events"
    __table_args__ = (Index("ix_job_events_job_step", "job_id", "step"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    rank: Mapped[int] = mapped_column(Integer)
    name: Mapped[str] = mapped_column(String(128))
    step: Mapped[int | None] = mapped_column(BigInteger)
    ts: Mapped[float | None] = mapped_column(Double)
    attrs: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
