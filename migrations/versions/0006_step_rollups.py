"""Step rollups: a downsampling pyramid of steps for the dashboard's charts

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-29
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op


revision: str = '0006'
down_revision: str | None = '0005'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# backend.telemetry.models.ROLLUP_WIDTHS when this revision was written.
WIDTHS = (16, 64, 256, 1024, 4096)
COLUMNS = (
    'job_id, level, bin, rank, n, sum_duration, max_duration, sum_compute, max_compute, '
    'n_loss, sum_loss, n_nonfinite_loss, max_mem'
)
FINITE = 'loss BETWEEN -1e300 AND 1e300'


def upgrade() -> None:
    op.create_table('step_rollups',
    sa.Column('job_id', sa.Integer(), nullable=False),
    sa.Column('level', sa.Integer(), nullable=False),
    sa.Column('bin', sa.BigInteger(), nullable=False),
    sa.Column('rank', sa.Integer(), nullable=False),
    sa.Column('n', sa.Integer(), nullable=False),
    sa.Column('sum_duration', sa.Double(), nullable=False),
    sa.Column('max_duration', sa.Double(), nullable=False),
    sa.Column('sum_compute', sa.Double(), nullable=False),
    sa.Column('max_compute', sa.Double(), nullable=False),
    sa.Column('n_loss', sa.Integer(), nullable=False),
    sa.Column('sum_loss', sa.Double(), nullable=False),
    sa.Column('n_nonfinite_loss', sa.Integer(), nullable=False),
    sa.Column('max_mem', sa.BigInteger(), nullable=True),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], name=op.f('fk_step_rollups_job_id_jobs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('job_id', 'level', 'bin', 'rank', name=op.f('pk_step_rollups'))
    )
    # Backfill from the steps already stored (ingest keeps them from here on).
    op.execute(
        f'INSERT INTO step_rollups ({COLUMNS}) '
        f'SELECT job_id, 0, step / {WIDTHS[0]}, rank, count(*), sum(duration_s), '
        'max(duration_s), sum(duration_s - coalesce(comm_s, 0.0)), '
        'max(duration_s - coalesce(comm_s, 0.0)), '
        f'sum(CASE WHEN {FINITE} THEN 1 ELSE 0 END), '
        f'coalesce(sum(CASE WHEN {FINITE} THEN loss END), 0.0), '
        f'sum(CASE WHEN loss IS NOT NULL AND NOT ({FINITE}) THEN 1 ELSE 0 END), '
        'max(mem_bytes) '
        f'FROM steps WHERE job_id IN (SELECT id FROM jobs) GROUP BY job_id, step / {WIDTHS[0]}, rank'
    )
    for level in range(1, len(WIDTHS)):
        factor = WIDTHS[level] // WIDTHS[level - 1]
        op.execute(
            f'INSERT INTO step_rollups ({COLUMNS}) '
            f'SELECT job_id, {level}, bin / {factor}, rank, sum(n), sum(sum_duration), '
            'max(max_duration), sum(sum_compute), max(max_compute), sum(n_loss), '
            'sum(sum_loss), sum(n_nonfinite_loss), max(max_mem) '
            f'FROM step_rollups WHERE level = {level - 1} GROUP BY job_id, bin / {factor}, rank'
        )


def downgrade() -> None:
    op.drop_table('step_rollups')
