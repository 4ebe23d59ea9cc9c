"""Activation-swap state of a job: the shape fingerprints its steps ran, and the policies
Vigil generated for its op sequences.

``ShapeFingerprint``: one row per (job, ``shape_fp``) the job's steps carried, with the
first step and rank that ran it and, once a captured step covered it, the op-sequence
fingerprint (``opseqs.hash``) behind it. ``SwapPolicy``: one row per generated policy,
versioned per job; ``policy`` is the POLICY dict of ``detectors.swap`` the collector applies.
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
    Index,
    Integer,
    String,
    UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column

from backend.db import Base, UTCDateTime, utcnow


class ShapeFingerprint(Base):
    __tablename__ = "shape_fingerprints"

    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    shape_fp: Mapped[str] = mapped_column(String(64), primary_key=True)
    first_step: Mapped[int] = mapped_column(BigInteger)
    first_rank: Mapped[int] = mapped_column(Integer)
    # The op-sequence fingerprint a captured step with this shape_fp reported (NULL until one).
    opseq: Mapped[str | None] = mapped_column(String(64))
    first_seen_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


SWAP_POLICY_STATES = ("proposed", "applied", "superseded", "failed")

# The allowed state changes (from, to); anything else is a bug.
POLICY_MOVES = frozenset(
    {
        ("proposed", "applied"),
        ("proposed", "superseded"),
        ("proposed", "failed"),
        ("applied", "superseded"),
        ("superseded", "applied"),
        ("failed", "applied"),
    }
)


class SwapPolicy(Base):
    __tablename__ = "swap_policies"
    __table_args__ = (
        UniqueConstraint("job_id", "version"),
        Index("ix_swap_policies_job_opseq", "job_id", "opseq"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    version: Mapped[int] = mapped_column(Integer)  # per job, from 1
    opseq: Mapped[str] = mapped_column(String(64))  # the op sequence it was made for
    budget_bytes: Mapped[int] = mapped_column(BigInteger)
    bandwidth_bytes_per_s: Mapped[float] = mapped_column(Double)
    margin: Mapped[float] = mapped_column(Double, default=0.0)  # of the budget held back
    reason: Mapped[str] = mapped_column(String(32))  # opseq_change, memory_pressure, over_budget
    state: Mapped[str] = mapped_column(String(16), default="proposed")
    policy: Mapped[dict[str, Any]] = mapped_column(JSON)
    predicted_peak_bytes: Mapped[int] = mapped_column(BigInteger)
    predicted_exposed_s: Mapped[float] = mapped_column(Double, default=0.0)
    feasible: Mapped[bool] = mapped_column(Boolean, default=True)
    incident_id: Mapped[int | None] = mapped_column(Integer)
    action_id: Mapped[int | None] = mapped_column(Integer)
    # From step events that report it applied: first step, and the highest measured peak.
    applied_step: Mapped[int | None] = mapped_column(BigInteger)
    measured_peak_bytes: Mapped[int | None] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)

    def move_to(self, to: str) -> bool:
        """Move to state ``to`` (True if it moved); a move not in ``POLICY_MOVES`` raises
        ValueError. (Here, not in ``backend.swap.service``: modules that handle actions may
        set an action's state only through ``backend.actions.states``.)"""
        if self.state == to:
            return False
        if (self.state, to) not in POLICY_MOVES:
            raise ValueError(f"swap policy v{self.version}: {self.state} → {to} is not allowed")
        self.state = to
        return True
