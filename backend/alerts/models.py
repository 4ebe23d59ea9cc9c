"""Alert webhooks: receivers (where and how to notify) and deliveries (the outbox).

A delivery row is written in the same transaction as the incident change it reports, so a
notification is never lost to a crash between the two; senders then claim due rows, post
them outside any transaction, and record the outcome. The payload is frozen at creation:
retries send the same bytes under the same ``webhook_id``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, Boolean, ForeignKey, Index, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from backend.db import Base, UTCDateTime, utcnow

RECEIVER_FORMATS = ("alertmanager", "slack", "generic")
DELIVERY_STATES = ("pending", "sending", "delivered", "failed")
DELIVERY_STATUSES = ("firing", "resolved", "test")


class WebhookReceiver(Base):
    __tablename__ = "webhook_receivers"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    url: Mapped[str] = mapped_column(Text)
    format: Mapped[str] = mapped_column(String(16), default="alertmanager")
    # Standard Webhooks signing secret ("whsec_<base64>") for the generic format.
    secret: Mapped[str | None] = mapped_column(String(200))
    # Extra request headers, e.g. {"Authorization": "Bearer …"} for a protected receiver.
    headers: Mapped[dict[str, str]] = mapped_column(JSON, default=dict)
    # Filters; null means "any". Jobs by exact name, kinds from the incident kinds.
    jobs: Mapped[list[str] | None] = mapped_column(JSON)
    kinds: Mapped[list[str] | None] = mapped_column(JSON)
    severities: Mapped[list[str] | None] = mapped_column(JSON)
    send_resolved: Mapped[bool] = mapped_column(Boolean, default=True)
    # While an incident stays open, remind after this long (Alertmanager's repeat_interval).
    repeat_interval_s: Mapped[int] = mapped_column(Integer, default=4 * 3600)
    enabled: Mapped[bool] = mapped_column(Boolean, default=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class WebhookDelivery(Base):
    __tablename__ = "webhook_deliveries"
    __table_args__ = (
        Index("ix_webhook_deliveries_state_due", "state", "next_attempt_at"),
        Index("ix_webhook_deliveries_receiver_incident", "receiver_id", "incident_id"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    receiver_id: Mapped[int] = mapped_column(ForeignKey("webhook_receivers.id", ondelete="CASCADE"))
    incident_id: Mapped[int | None] = mapped_column(ForeignKey("incidents.id", ondelete="SET NULL"))
    status: Mapped[str] = mapped_column(String(16))  # firing | resolved | test
    state: Mapped[str] = mapped_column(String(16), default="pending")
    webhook_id: Mapped[str] = mapped_column(String(64))  # the same on every retry
    payload: Mapped[dict[str, Any]] = mapped_column(JSON)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    last_attempt_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    response_code: Mapped[int | None] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    delivered_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
