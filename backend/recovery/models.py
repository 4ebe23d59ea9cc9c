"""Recovery policies: per job and incident kind, auto, approve or off.

The audit trail they write to is ``backend.audit.models.AuditEntry``.

Policies are keyed by job *name*, not id, so they can be set before a job first reports;
``"*"`` is the default for every job and every kind. The most specific row wins:
(job, kind) > (job, "*") > ("*", kind) > ("*", "*").
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, Integer, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from backend.db import Base, UTCDateTime, utcnow

POLICY_MODES = ("auto", "approve", "off")


class RecoveryPolicy(Base):
    __tablename__ = "recovery_policies"
    __table_args__ = (UniqueConstraint("job", "kind"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job: Mapped[str] = mapped_column(String(200))  # job name or "*"
    kind: Mapped[str] = mapped_column(String(32))  # incident kind or "*"
    mode: Mapped[str] = mapped_column(String(16), default="approve")
    # Candidate actions allowed for this kind (null: the built-in candidates for the kind).
    actions: Mapped[list[str] | None] = mapped_column(JSON)
    # Cost-model inputs and guards, e.g. {"horizon_s": 36000, "allow_evict": true,
    # "cooldown_s": 300, "max_restarts_per_hour": 3}.
    params: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    updated_by: Mapped[str] = mapped_column(String(128), default="")
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
