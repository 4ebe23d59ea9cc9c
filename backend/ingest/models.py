"""Accepted ingest batches, remembered so that a retried ``batch_id`` is stored once.

A ``batch_id`` is unique per job. ``content_hash`` is the SHA-256 (hex) of the batch's
decompressed body: a retry sends the same body, so the same id with another hash is new
data under a reused id, refused (409) rather than dropped. NULL for batches stored
before the hash was kept (revision 0010): those retries are taken as duplicates.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import ForeignKey, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from backend.db import Base, UTCDateTime, utcnow


class IngestBatch(Base):
    __tablename__ = "ingest_batches"

    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    batch_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    content_hash: Mapped[str | None] = mapped_column(String(64))
    rank: Mapped[int] = mapped_column(Integer)
    events: Mapped[int] = mapped_column(Integer)
    received_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, index=True)
