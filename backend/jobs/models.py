"""Jobs, their runs, and the latest known state of each of their ranks.

A job is a name; each launch of it is a *run* (``backend.jobs.runs`` says how runs are told
apart, judged and ended). Telemetry rows keep ``(job_id, attempt)``: every run gets a fresh
range of the job's attempt numbers (``Run.first_attempt``), so a job's attempt numbers
never repeat across runs and the detection window's "current attempt" stays one column.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Double,
    ForeignKey,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column

from backend.db import Base, UTCDateTime, utcnow

JOB_KINDS = ("training", "serving")
RUN_STATES = ("running", "finished", "failed", "lost")


class Job(Base):
    __tablename__ = "jobs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    kind: Mapped[str] = mapped_column(String(16), default="training")
    world_size: Mapped[int] = mapped_column(Integer, default=1)
    # The current attempt, numbered job-wide (its run's ``first_attempt`` + torchrun's
    # restart count); rarely written, so ranks never contend on this row.
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    # The current run (``runs.id``); no foreign key, since runs point at their job.
    run_id: Mapped[int | None] = mapped_column(Integer)


class Run(Base):
    """One launch of a job: torchrun's run id, ``vigil run``'s launch id, or a key the
    server made when a keyless launch took over. Restart attempts happen inside a run:
    its attempt ``a`` is stored as the job's attempt ``first_attempt + a``."""

    __tablename__ = "runs"
    __table_args__ = (UniqueConstraint("job_id", "key"), UniqueConstraint("job_id", "number"))

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    key: Mapped[str] = mapped_column(String(128))
    number: Mapped[int] = mapped_column(Integer)  # 1, 2, … within the job, for people
    kind: Mapped[str] = mapped_column(String(16), default="training")
    first_attempt: Mapped[int] = mapped_column(Integer, default=0)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    state: Mapped[str] = mapped_column(String(16), default="running")
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    reason: Mapped[str] = mapped_column(Text, default="")
    # When the run's open incidents and actions were settled after it ended.
    closed_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class Rank(Base):
    """One row per (job, rank), overwritten as batches and heartbeats arrive."""

    __tablename__ = "ranks"
    __table_args__ = (UniqueConstraint("job_id", "rank"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    rank: Mapped[int] = mapped_column(Integer)
    host: Mapped[str | None] = mapped_column(String(255))
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    # Last completed step (from step events) and the step in progress (from heartbeats).
    last_step: Mapped[int | None] = mapped_column(BigInteger)
    current_step: Mapped[int | None] = mapped_column(BigInteger)
    last_step_ts: Mapped[float | None] = mapped_column(Double)
    last_heartbeat_ts: Mapped[float | None] = mapped_column(Double)
    # The collective this rank is inside right now: {"group", "op", "seq", "since"}.
    inflight: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    pid: Mapped[int | None] = mapped_column(Integer)
    # The collector said goodbye (clean exit); a silent rank without it crashed or was killed.
    exited: Mapped[bool] = mapped_column(Boolean, default=False)
    # The exit code its goodbye carried (0: clean; None: not said, or no goodbye).
    exit_code: Mapped[int | None] = mapped_column(Integer)
    # What the collector dropped so far, by reason ({"queue_full": 12}); from heartbeats.
    drops: Mapped[dict[str, int] | None] = mapped_column(JSON)
    # Device memory capacity in bytes (CUDA total memory, or VIGIL_MEMORY_BUDGET_BYTES), and
    # whether the rank can apply activation-swap policies; from heartbeats.
    mem_capacity: Mapped[int | None] = mapped_column(BigInteger)
    swap_capable: Mapped[bool] = mapped_column(Boolean, default=False)
    last_seen_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
