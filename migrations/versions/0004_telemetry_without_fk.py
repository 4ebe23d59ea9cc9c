"""Drop foreign keys from the step and collective tables (ingest speed)

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-22
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op


revision: str = '0004'
down_revision: str | None = '0003'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('collectives', schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f('fk_collectives_job_id_jobs'), type_='foreignkey')

    with op.batch_alter_table('steps', schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f('fk_steps_job_id_jobs'), type_='foreignkey')



def downgrade() -> None:
    with op.batch_alter_table('steps', schema=None) as batch_op:
        batch_op.create_foreign_key(batch_op.f('fk_steps_job_id_jobs'), 'jobs', ['job_id'], ['id'], ondelete='CASCADE')

    with op.batch_alter_table('collectives', schema=None) as batch_op:
        batch_op.create_foreign_key(batch_op.f('fk_collectives_job_id_jobs'), 'jobs', ['job_id'], ['id'], ondelete='CASCADE')

