"""activation swapping: shape fingerprints, op-sequence profiles, swap policies, capacity

Steps carry their shape fingerprint and the swap policy they ran under with its measured
peak; op sequences keep their profile and a names-only structure hash; ranks report their
device memory capacity and whether they can apply swap policies. New tables
``shape_fingerprints`` (first sighting of each shape fingerprint per job) and
``swap_policies`` (generated policies, versioned per job).

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-24
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from backend.db import UTCDateTime

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("steps", schema=None) as batch_op:
        batch_op.add_column(sa.Column("shape_fp", sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column("swap_policy", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("swap_peak_bytes", sa.BigInteger(), nullable=True))
    with op.batch_alter_table("opseqs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("structure", sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column("profile", sa.JSON(), nullable=True))
    with op.batch_alter_table("ranks", schema=None) as batch_op:
        batch_op.add_column(sa.Column("mem_capacity", sa.BigInteger(), nullable=True))
        batch_op.add_column(
            sa.Column("swap_capable", sa.Boolean(), nullable=False, server_default=sa.false())
        )
    op.create_table(
        "shape_fingerprints",
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("shape_fp", sa.String(length=64), nullable=False),
        sa.Column("first_step", sa.BigInteger(), nullable=False),
        sa.Column("first_rank", sa.Integer(), nullable=False),
        sa.Column("opseq", sa.String(length=64), nullable=True),
        sa.Column("first_seen_at", UTCDateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["jobs.id"],
            name=op.f("fk_shape_fingerprints_job_id_jobs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("job_id", "shape_fp", name=op.f("pk_shape_fingerprints")),
    )
    op.create_table(
        "swap_policies",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("opseq", sa.String(length=64), nullable=False),
        sa.Column("budget_bytes", sa.BigInteger(), nullable=False),
        sa.Column("bandwidth_bytes_per_s", sa.Double(), nullable=False),
        sa.Column("margin", sa.Double(), nullable=False),
        sa.Column("reason", sa.String(length=32), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("policy", sa.JSON(), nullable=False),
        sa.Column("predicted_peak_bytes", sa.BigInteger(), nullable=False),
        sa.Column("predicted_exposed_s", sa.Double(), nullable=False),
        sa.Column("feasible", sa.Boolean(), nullable=False),
        sa.Column("incident_id", sa.Integer(), nullable=True),
        sa.Column("action_id", sa.Integer(), nullable=True),
        sa.Column("applied_step", sa.BigInteger(), nullable=True),
        sa.Column("measured_peak_bytes", sa.BigInteger(), nullable=True),
        sa.Column("created_at", UTCDateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_swap_policies_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_swap_policies")),
        sa.UniqueConstraint("job_id", "version", name=op.f("uq_swap_policies_job_id_version")),
    )
    op.create_index(
        "ix_swap_policies_job_opseq", "swap_policies", ["job_id", "opseq"], unique=False
    )


def downgrade() -> None:
    op.drop_index("ix_swap_policies_job_opseq", table_name="swap_policies")
    op.drop_table("swap_policies")
    op.drop_table("shape_fingerprints")
    with op.batch_alter_table("ranks", schema=None) as batch_op:
        batch_op.drop_column("swap_capable")
        batch_op.drop_column("mem_capacity")
    with op.batch_alter_table("opseqs", schema=None) as batch_op:
        batch_op.drop_column("profile")
        batch_op.drop_column("structure")
    with op.batch_alter_table("steps", schema=None) as batch_op:
        batch_op.drop_column("swap_peak_bytes")
        batch_op.drop_column("swap_policy")
        batch_op.drop_column("shape_fp")
