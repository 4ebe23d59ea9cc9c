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

from backend.alerts import sealing
from backend.db import Base, UTCDateTime, utcnow
from backend.errors import Invalid

RECEIVER_FORMATS = ("alertmanager", "slack", "generic")
DELIVERY_STATES = ("pending", "sending", "delivered", "failed")
DELIVERY_STATUSES = ("firing", "resolved", "test")
SECRET_CHARS = 200  # the column's width; a sealed 64-byte whsec_ secret takes 171


class WebhookReceiver(Base):
    __tablename__ = "webhook_receivers"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    url: Mapped[str] = mapped_column(Text)
    format: Mapped[str] = mapped_column(String(16), default="alertmanager")
    # Standard Webhooks signing secret ("whsec_<base64>") for the generic format, sealed
    # ("enc:v1:…", backend.alerts.sealing): read and set it through ``secret``.
    secret_stored: Mapped[str | None] = mapped_column("secret", String(200))
    # Extra request headers, e.g. {"Authorization": "Bearer …"} for a protected receiver;
    # values sealed: read and set them through ``headers``.
    headers_stored: Mapped[dict[str, str]] = mapped_column("headers", JSON, default=dict)
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

    @property
    def secret(self) -> str | None:
        """The signing secret in clear; ``SecretUnreadable`` if the key changed."""
        stored = self.secret_stored
        return sealing.unseal(stored) if stored else stored

    @secret.setter
    def secret(self, value: str | None) -> None:
        sealed = sealing.seal(value) if value else value
        if sealed is not None and len(sealed) > SECRET_CHARS:
            raise Invalid("secret: too long (a whsec_ secret's key is 16 to 64 bytes)")
        self.secret_stored = sealed

    @property
    def headers(self) -> dict[str, str]:
        """The extra headers with their values in clear (``SecretUnreadable`` if the key
        changed); their names are not secret: ``header_names``."""
        return {k: sealing.unseal(v) for k, v in (self.headers_stored or {}).items()}

    @headers.setter
    def headers(self, value: dict[str, str] | None) -> None:
        self.headers_stored = {k: sealing.seal(v) for k, v in (value or {}).items()}

    @property
    def header_names(self) -> list[str]:
        return sorted(self.headers_stored or {})

    @property
    def stored_in_clear(self) -> bool:
        """Written by a version that did not seal credentials (sealed on the next change)."""
        values = [self.secret_stored or "", *(self.headers_stored or {}).values()]
        return any(v and not sealing.is_sealed(v) for v in values)


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
