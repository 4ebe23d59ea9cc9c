"""serving: request token times, model, replica, queue; serving minutes; SLOs and their minutes

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-24
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import backend.db


revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "slos",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job", sa.String(length=200), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("model", sa.String(length=128), nullable=True),
        sa.Column("ttft_s", sa.Double(), nullable=True),
        sa.Column("tpot_s", sa.Double(), nullable=True),
        sa.Column("max_tbt_s", sa.Double(), nullable=True),
        sa.Column("e2e_s", sa.Double(), nullable=True),
        sa.Column("objective", sa.Double(), nullable=False),
        sa.Column("period_s", sa.Double(), nullable=False),
        sa.Column("created_at", backend.db.UTCDateTime(timezone=True), nullable=False),
        sa.Column("updated_at", backend.db.UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_slos")),
        sa.UniqueConstraint("job", "name", name=op.f("uq_slos_job_name")),
    )
    op.create_table(
        "serving_minutes",
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("replica", sa.String(length=200), nullable=False),
        sa.Column("minute", sa.BigInteger(), nullable=False),
        sa.Column("requests", sa.Integer(), nullable=False),
        sa.Column("errors", sa.Integer(), nullable=False),
        sa.Column("arrivals", sa.Integer(), nullable=False),
        sa.Column("output_tokens", sa.BigInteger(), nullable=False),
        sa.Column("ttft_sum", sa.Double(), nullable=False),
        sa.Column("ttft_n", sa.Integer(), nullable=False),
        sa.Column("tpot_sum", sa.Double(), nullable=False),
        sa.Column("tpot_n", sa.Integer(), nullable=False),
        sa.Column("queue_sum", sa.Double(), nullable=False),
        sa.Column("queue_n", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_serving_minutes_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("job_id", "replica", "minute", name=op.f("pk_serving_minutes")),
    )
    op.create_table(
        "slo_minutes",
        sa.Column("slo_id", sa.Integer(), nullable=False),
        sa.Column("minute", sa.BigInteger(), nullable=False),
        sa.Column("total", sa.Integer(), nullable=False),
        sa.Column("good", sa.Integer(), nullable=False),
        sa.Column("good_ttft", sa.Integer(), nullable=False),
        sa.Column("good_tpot", sa.Integer(), nullable=False),
        sa.Column("good_max_tbt", sa.Integer(), nullable=False),
        sa.Column("good_e2e", sa.Integer(), nullable=False),
        sa.Column("good_tokens", sa.BigInteger(), nullable=False),
        sa.Column("smooth", sa.Double(), nullable=False),
        sa.ForeignKeyConstraint(
            ["slo_id"], ["slos.id"], name=op.f("fk_slo_minutes_slo_id_slos"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("slo_id", "minute", name=op.f("pk_slo_minutes")),
    )
    with op.batch_alter_table("requests", schema=None) as batch_op:
        batch_op.add_column(sa.Column("queue_s", sa.Double(), nullable=True))
        batch_op.add_column(sa.Column("model", sa.String(length=128), nullable=True))
        batch_op.add_column(sa.Column("replica", sa.String(length=128), nullable=True))
        batch_op.add_column(sa.Column("token_stride", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("token_deltas", sa.LargeBinary(), nullable=True))
    # Requests stored before this revision get their minutes here, as ingest keeps them
    # from now on (they have no replica, and count as arriving in the minute they ended).
    minute = (
        'floor(coalesce("end", arrival) / 60)::bigint'
        if op.get_bind().dialect.name == "postgresql"
        else 'CAST(coalesce("end", arrival) / 60 AS INTEGER)'
    )
    op.execute(
        "INSERT INTO serving_minutes (job_id, replica, minute, requests, errors, arrivals, "
        "output_tokens, ttft_sum, ttft_n, tpot_sum, tpot_n, queue_sum, queue_n) "
        f"SELECT job_id, '', {minute}, count(*), "
        "sum(CASE WHEN status = 'ok' THEN 0 ELSE 1 END), count(*), "
        "coalesce(sum(output_tokens), 0), "
        "coalesce(sum(first_token - arrival), 0), count(first_token), "
        'coalesce(sum(CASE WHEN output_tokens > 1 AND "end" IS NOT NULL '
        'AND first_token IS NOT NULL THEN ("end" - first_token) / (output_tokens - 1) END), 0), '
        'count(CASE WHEN output_tokens > 1 AND "end" IS NOT NULL '
        "AND first_token IS NOT NULL THEN 1 END), 0, 0 "
        f"FROM requests WHERE job_id IN (SELECT id FROM jobs) GROUP BY job_id, {minute}"
    )


def downgrade() -> None:
    with op.batch_alter_table("requests", schema=None) as batch_op:
        batch_op.drop_column("token_deltas")
        batch_op.drop_column("token_stride")
        batch_op.drop_column("replica")
        batch_op.drop_column("model")
        batch_op.drop_column("queue_s")

    op.drop_table("slo_minutes")
    op.drop_table("serving_minutes")
    op.drop_table("slos")
