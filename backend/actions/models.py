"""Recovery actions: a state machine with an idempotency key, who asked, and a result.

proposed → (approved) pending → dispatched → acked → succeeded | failed | cancelled | expired

``proposed`` is an action the recovery policy chose for a job whose policy says
``approve``: nothing reaches a rank until a person approves it (it becomes ``pending``).
The allowed moves, and the one function that makes them: ``backend.actions.states``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, ForeignKey, Index, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from backend.db import Base, UTCDateTime, utcnow

ACTION_KINDS = (
    "restart",
    "evict_rank",
    "checkpoint_now",
    "dump_stacks",
    "rollback",
    "apply_swap_policy",
    "exit_for_restart",
)
ACTION_STATES = (
    "proposed",
    "pending",
    "dispatched",
    "acked",
    "succeeded",
    "failed",
    "cancelled",
    "expired",
)


class Action(Base):
    __tablename__ = "actions"
    __table_args__ = (Index("ix_actions_job_state", "job_id", "state"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    incident_id: Mapped[int | None] = mapped_column(ForeignKey("incidents.id", ondelete="SET NULL"))
    kind: Mapped[str] = mapped_column(String(32))
    state: Mapped[str] = mapped_column(String(16), default="pending")
    idempotency_key: Mapped[str] = mapped_column(String(128), unique=True)
    requested_by: Mapped[str] = mapped_column(String(128))
    target_ranks: Mapped[list[int] | None] = mapped_column(JSON)
    params: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    reason: Mapped[str] = mapped_column(Text, default="")
    # The job's restart attempt when the action was created: only that incarnation's
    # processes receive it (a restart must not be re-run by the group it started).
    attempt: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # The recovery policy's choice: candidates with their expected costs, guards applied.
    reasoning: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    approved_by: Mapped[str | None] = mapped_column(String(128))
    result: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # Per-rank progress: {"3": {"state": "succeeded", "result": {...}, "at": "..."}}.
    deliveries: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
