"""Collective rollups: bytes and seconds per job, level, step bin, rank and group

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-22
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op


revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

WIDTHS = (16, 64, 256, 1024, 4096)  # backend.telemetry.models.ROLLUP_WIDTHS when written


def upgrade() -> None:
    op.create_table(
        "collective_rollups",
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("level", sa.Integer(), nullable=False),
        sa.Column("bin", sa.BigInteger(), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("group", sa.String(length=128), nullable=False),
        sa.Column("n", sa.Integer(), nullable=False),
        sa.Column("sum_bytes", sa.Double(), nullable=False),
        sa.Column("sum_seconds", sa.Double(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["jobs.id"],
            name=op.f("fk_collective_rollups_job_id_jobs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint(
            "job_id", "level", "bin", "rank", "group", name=op.f("pk_collective_rollups")
        ),
    )
    # Existing records get their rollups here, as ingest keeps them from now on.
    for level, width in enumerate(WIDTHS):
        op.execute(
            'INSERT INTO collective_rollups (job_id, level, bin, rank, "group", n, sum_bytes, '
            f"sum_seconds) SELECT job_id, {level}, step / {width}, rank, \"group\", count(*), "
            "sum(bytes), sum(duration_s) FROM collectives "
            "WHERE step IS NOT NULL AND duration_s > 0 "
            "AND job_id IN (SELECT id FROM jobs) "
            f'GROUP BY job_id, step / {width}, rank, "group"'
        )


def downgrade() -> None:
    op.drop_table("collective_rollups")
