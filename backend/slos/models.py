"""Service level objectives for serving jobs, and their per-minute counts.

An SLO is keyed by job *name* (it can be set before the job starts), optionally narrowed to
one model, with thresholds on TTFT, TPOT, max time-between-tokens and end-to-end latency
(each optional, at least one), an objective (0.99: 99% of requests good) and a period
(28 days). Ingest judges every finished request against the job's SLOs and adds it to
``slo_minutes`` (the minute it ended), which the burn-rate alerts and the REST status read.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, Double, ForeignKey, Integer, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from backend.db import Base, UTCDateTime, utcnow

THRESHOLDS = ("ttft_s", "tpot_s", "max_tbt_s", "e2e_s")


class Slo(Base):
    __tablename__ = "slos"
    __table_args__ = (UniqueConstraint("job", "name"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job: Mapped[str] = mapped_column(String(200))
    name: Mapped[str] = mapped_column(String(128))
    model: Mapped[str | None] = mapped_column(String(128))
    ttft_s: Mapped[float | None] = mapped_column(Double)
    tpot_s: Mapped[float | None] = mapped_column(Double)
    max_tbt_s: Mapped[float | None] = mapped_column(Double)
    e2e_s: Mapped[float | None] = mapped_column(Double)
    objective: Mapped[float] = mapped_column(Double)
    period_s: Mapped[float] = mapped_column(Double)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)

    def thresholds(self) -> dict[str, float]:
        """The thresholds set, by name (``ttft_s`` …)."""
        return {t: v for t in THRESHOLDS if (v := getattr(self, t)) is not None}


class SloMinute(Base):
    """One SLO's requests in one minute: judged, good (every threshold met), good per
    threshold, and output tokens of the good ones (token goodput)."""

    __tablename__ = "slo_minutes"

    slo_id: Mapped[int] = mapped_column(ForeignKey("slos.id", ondelete="CASCADE"), primary_key=True)
    minute: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    total: Mapped[int] = mapped_column(Integer, default=0)
    good: Mapped[int] = mapped_column(Integer, default=0)
    good_ttft: Mapped[int] = mapped_column(Integer, default=0)
    good_tpot: Mapped[int] = mapped_column(Integer, default=0)
    good_max_tbt: Mapped[int] = mapped_column(Integer, default=0)
    good_e2e: Mapped[int] = mapped_column(Integer, default=0)
    good_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    smooth: Mapped[float] = mapped_column(Double, default=0.0)  # sum of per-request scores
