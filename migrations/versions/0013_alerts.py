"""alert handling: acknowledge, manual resolve, silences, grouped notifications

Incidents record who acknowledged them and when, who resolved them by hand and with what
note, and whether such a resolve still holds back the detector's findings of the same
episode (``held``). Receivers gain ``group_by`` (null: the format's default) and
``group_wait_s``; a delivery carries a group of incidents (``group_key``, and the new link
table ``webhook_delivery_incidents``, filled here from each existing delivery's incident).
New table ``silences``.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-24
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from backend.db import UTCDateTime

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Plain ALTER TABLE, not batch mode: SQLite would rebuild ``incidents`` by dropping it,
    # and with foreign keys on that clears every delivery's, action's and audit entry's
    # incident (no change here needs a rebuild).
    op.add_column("incidents", sa.Column("acked_at", UTCDateTime(), nullable=True))
    op.add_column("incidents", sa.Column("acked_by", sa.String(length=128), nullable=True))
    op.add_column("incidents", sa.Column("resolved_by", sa.String(length=128), nullable=True))
    op.add_column("incidents", sa.Column("resolution_note", sa.Text(), nullable=True))
    op.add_column(
        "incidents", sa.Column("held", sa.Boolean(), server_default=sa.false(), nullable=False)
    )
    op.add_column("webhook_receivers", sa.Column("group_by", sa.JSON(), nullable=True))
    op.add_column(
        "webhook_receivers",
        sa.Column("group_wait_s", sa.Integer(), server_default="10", nullable=False),
    )
    op.add_column("webhook_deliveries", sa.Column("group_key", sa.String(length=64), nullable=True))
    op.create_index(
        "ix_webhook_deliveries_receiver_group",
        "webhook_deliveries",
        ["receiver_id", "group_key"],
        unique=False,
    )

    op.create_table(
        "webhook_delivery_incidents",
        sa.Column("delivery_id", sa.Integer(), nullable=False),
        sa.Column("incident_id", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["delivery_id"],
            ["webhook_deliveries.id"],
            name=op.f("fk_webhook_delivery_incidents_delivery_id_webhook_deliveries"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["incident_id"],
            ["incidents.id"],
            name=op.f("fk_webhook_delivery_incidents_incident_id_incidents"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint(
            "delivery_id", "incident_id", name=op.f("pk_webhook_delivery_incidents")
        ),
    )
    op.create_index(
        "ix_webhook_delivery_incidents_incident",
        "webhook_delivery_incidents",
        ["incident_id"],
        unique=False,
    )
    # Every delivery so far named one incident: link it, so "was this receiver told it
    # fired" (resolved notifications, reminders) reads one table for old and new rows.
    op.execute(
        "INSERT INTO webhook_delivery_incidents (delivery_id, incident_id) "
        "SELECT id, incident_id FROM webhook_deliveries WHERE incident_id IS NOT NULL"
    )

    op.create_table(
        "silences",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("matchers", sa.JSON(), nullable=False),
        sa.Column("starts_at", UTCDateTime(), nullable=False),
        sa.Column("ends_at", UTCDateTime(), nullable=False),
        sa.Column("created_by", sa.String(length=128), nullable=False),
        sa.Column("comment", sa.Text(), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("expired_by", sa.String(length=128), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_silences")),
    )
    op.create_index("ix_silences_ends_at", "silences", ["ends_at"], unique=False)


def downgrade() -> None:
    # In place, as the upgrade (SQLite 3.35+ drops a plain, unindexed column in place).
    op.drop_index("ix_silences_ends_at", table_name="silences")
    op.drop_table("silences")
    op.drop_index("ix_webhook_delivery_incidents_incident", table_name="webhook_delivery_incidents")
    op.drop_table("webhook_delivery_incidents")
    op.drop_index("ix_webhook_deliveries_receiver_group", table_name="webhook_deliveries")
    op.drop_column("webhook_deliveries", "group_key")
    op.drop_column("webhook_receivers", "group_wait_s")
    op.drop_column("webhook_receivers", "group_by")
    for column in ("held", "resolution_note", "resolved_by", "acked_by", "acked_at"):
        op.drop_column("incidents", column)
