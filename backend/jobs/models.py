"""Jobs and the latest known state of each of their ranks."""

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
    UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column

from backend.db import Base, UTCDateTime, utcnow

JOB_KINDS = ("training", "serving")


class Job(Base):
    __tablename__ = "jobs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    kind: Mapped[str] = mapped_column(String(16), default="training")
    world_size: Mapped[int] = mapped_column(Integer, default=1)
    # Highest restart attempt seen; rarely written, so ranks never contend on this row.
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


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
    # What the collector dropped so far, by reason ({"queue_full": 12}); from heartbeats.
    drops: Mapped[dict[str, int] | None] = mapped_column(JSON)
    last_seen_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
