"""ingest batches: batch_id unique per job, with the body's content hash

A retried batch_id with other content is refused (409) instead of silently dropped, and
the same batch_id under another job is that job's batch. Rows stored before keep a NULL
hash. Downgrading makes batch_id unique across jobs again: of rows sharing a batch_id,
the one of the lowest job id is kept.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-26
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("ingest_batches", schema=None) as batch_op:
        batch_op.add_column(sa.Column("content_hash", sa.String(length=64), nullable=True))
        batch_op.drop_index(batch_op.f("ix_ingest_batches_job_id"))  # the key leads with it
        batch_op.drop_constraint(batch_op.f("pk_ingest_batches"), type_="primary")
        batch_op.create_primary_key(batch_op.f("pk_ingest_batches"), ["job_id", "batch_id"])


def downgrade() -> None:
    op.execute(
        "DELETE FROM ingest_batches WHERE EXISTS (SELECT 1 FROM ingest_batches AS other "
        "WHERE other.batch_id = ingest_batches.batch_id AND other.job_id < ingest_batches.job_id)"
    )
    with op.batch_alter_table("ingest_batches", schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f("pk_ingest_batches"), type_="primary")
        batch_op.create_primary_key(batch_op.f("pk_ingest_batches"), ["batch_id"])
        batch_op.create_index(batch_op.f("ix_ingest_batches_job_id"), ["job_id"], unique=False)
        batch_op.drop_column("content_hash")
