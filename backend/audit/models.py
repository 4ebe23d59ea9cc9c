"""The audit log table: one append-only row per thing that happened to recovery."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, ForeignKey, Index, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from backend.db import Base, UTCDateTime, utcnow


class AuditEntry(Base):
    """Who or what asked for what, and what happened: one row per event, append only."""

    __tablename__ = "audit_log"
    __table_args__ = (Index("ix_audit_log_job_at", "job_id", "at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int | None] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    action_id: Mapped[int | None] = mapped_column(ForeignKey("actions.id", ondelete="SET NULL"))
    incident_id: Mapped[int | None] = mapped_column(ForeignKey("incidents.id", ondelete="SET NULL"))
    at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    actor: Mapped[str] = mapped_column(String(128))  # "policy", "api:<token name>", "rank:3"
    event: Mapped[str] = mapped_column(String(32))  # proposed, created, approved, cancelled, …
    detail: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
