"""Incidents opened by detectors. Kinds and fields follow DESIGN.md's REST contract."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, Boolean, Double, ForeignKey, Index, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column
from sqlalchemy.sql import false

from backend.db import Base, UTCDateTime, utcnow
from detectors.finding import KINDS

INCIDENT_KINDS = KINDS  # one list: the detectors' finding kinds
SEVERITIES = ("info", "warning", "critical")
INCIDENT_STATUSES = ("open", "resolved")


class Incident(Base):
    __tablename__ = "incidents"
    __table_args__ = (
        Index("ix_incidents_job_status", "job_id", "status"),
        Index("ix_incidents_fingerprint", "fingerprint"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    kind: Mapped[str] = mapped_column(String(32))
    severity: Mapped[str] = mapped_column(String(16), default="warning")
    status: Mapped[str] = mapped_column(String(16), default="open")
    # Stable identity of "the same problem", so a detector re-firing updates, not duplicates.
    fingerprint: Mapped[str] = mapped_column(String(128))
    ranks: Mapped[list[int]] = mapped_column(JSON, default=list)
    first_step: Mapped[int | None] = mapped_column(BigInteger)
    score: Mapped[float | None] = mapped_column(Double)
    summary: Mapped[str] = mapped_column(Text, default="")
    evidence: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    detected_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    resolved_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # Handling by people (``backend.incidents.handling``): acknowledged (who, when), and
    # resolved by hand (who, with a note; null = resolved by detection).
    acked_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    acked_by: Mapped[str | None] = mapped_column(String(128))
    resolved_by: Mapped[str | None] = mapped_column(String(128))
    resolution_note: Mapped[str | None] = mapped_column(Text)
    # Resolved by hand while its detector still reports the episode: findings of the same
    # episode are ignored until the detector stops reporting it.
    held: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
