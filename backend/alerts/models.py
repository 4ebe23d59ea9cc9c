"""Alert webhooks: receivers (where and how to notify) and deliveries (the outbox).

A delivery row is written in the same transaction as the incident change it reports, so a
notification is never lost to a crash between the two; senders then claim due rows, post
them outside any transaction, and record the outcome.

A delivery carries a *group* of incidents (``backend.alerts.grouping``): the receiver's
``group_by`` labels pick the group, and for ``group_wait_s`` after a group's first
incident, more incidents of the same group join the same delivery (its payload is rebuilt).
Once a sender claims it, the payload is frozen: retries send the same bytes under the same
``webhook_id``. ``webhook_delivery_incidents`` links a delivery to every incident in it.

Silences (``backend.alerts.silences``) mute notifications for incidents their matchers
match, from ``starts_at`` until ``ends_at``; the incidents still open and show as silenced.
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
# Labels a receiver may group by (Alertmanager's ``group_by``); ``incident_id`` in the list
# means one notification per incident.
GROUP_LABELS = ("alertname", "job", "kind", "severity", "incident_id")
# A receiver's ``group_by`` when it sets none: people's formats group a job's burst; the
# generic format's consumers are programs that want one event per incident.
DEFAULT_GROUP_BY: dict[str, list[str]] = {
    "alertmanager": ["job"],
    "slack": ["job"],
    "generic": ["incident_id"],
}
DEFAULT_GROUP_WAIT_S = 10


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
    # Grouping (Alertmanager's group_by and group_wait): null = the format's default.
    group_by_stored: Mapped[list[str] | None] = mapped_column("group_by", JSON)
    group_wait_s: Mapped[int] = mapped_column(
        Integer, default=DEFAULT_GROUP_WAIT_S, server_default=str(DEFAULT_GROUP_WAIT_S)
    )
    enabled: Mapped[bool] = mapped_column(Boolean, default=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)

    @property
    def group_by(self) -> list[str]:
        """The labels notifications are grouped by (the format's default when unset)."""
        if self.group_by_stored is not None:
            return list(self.group_by_stored)
        return list(DEFAULT_GROUP_BY.get(self.format, ["job"]))

    @group_by.setter
    def group_by(self, value: list[str] | None) -> None:
        self.group_by_stored = None if value is None else list(value)

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
        Index("ix_webhook_deliveries_receiver_group", "receiver_id", "group_key"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    receiver_id: Mapped[int] = mapped_column(ForeignKey("webhook_receivers.id", ondelete="CASCADE"))
    # The group's first incident (all of them: ``DeliveryIncident``); null for a test.
    incident_id: Mapped[int | None] = mapped_column(ForeignKey("incidents.id", ondelete="SET NULL"))
    status: Mapped[str] = mapped_column(String(16))  # firing | resolved | test
    # SHA-256 of the status and group labels; null for tests and rows older than grouping.
    group_key: Mapped[str | None] = mapped_column(String(64))
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


class DeliveryIncident(Base):
    """One incident in one delivery's group (a delivery names one or more incidents)."""

    __tablename__ = "webhook_delivery_incidents"
    __table_args__ = (Index("ix_webhook_delivery_incidents_incident", "incident_id"),)

    delivery_id: Mapped[int] = mapped_column(
        ForeignKey("webhook_deliveries.id", ondelete="CASCADE"), primary_key=True
    )
    incident_id: Mapped[int] = mapped_column(
        ForeignKey("incidents.id", ondelete="CASCADE"), primary_key=True
    )


class Silence(Base):
    """Mutes notifications for the incidents its matchers match, while it is active.

    ``matchers``: any of ``job`` (exact, or a ``*``/``?`` glob), ``kind``, ``severity``,
    ``rank`` (the incident names that rank); all given must match. Active from
    ``starts_at`` until ``ends_at`` (expiring one early sets ``ends_at`` to that moment).
    """

    __tablename__ = "silences"
    __table_args__ = (Index("ix_silences_ends_at", "ends_at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    matchers: Mapped[dict[str, Any]] = mapped_column(JSON)
    starts_at: Mapped[datetime] = mapped_column(UTCDateTime)
    ends_at: Mapped[datetime] = mapped_column(UTCDateTime)
    created_by: Mapped[str] = mapped_column(String(128))
    comment: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    expired_by: Mapped[str | None] = mapped_column(String(128))

    def state(self, now: datetime) -> str:
        """``pending`` (starts later), ``active`` or ``expired``."""
        if now >= self.ends_at:
            return "expired"
        return "pending" if now < self.starts_at else "active"
