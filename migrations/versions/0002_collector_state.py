"""Track collector pid and drops per rank, process-group members, per-rank action deliveries

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op


revision: str = '0002'
down_revision: str | None = '0001'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('actions', schema=None) as batch_op:
        # Existing rows get an empty map; new rows get one from the model.
        batch_op.add_column(
            sa.Column('deliveries', sa.JSON(), nullable=False, server_default=sa.text("'{}'"))
        )

    with op.batch_alter_table('collectives', schema=None) as batch_op:
        batch_op.add_column(sa.Column('members', sa.JSON(), nullable=True))

    with op.batch_alter_table('ranks', schema=None) as batch_op:
        batch_op.add_column(sa.Column('pid', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('drops', sa.JSON(), nullable=True))



def downgrade() -> None:
    with op.batch_alter_table('ranks', schema=None) as batch_op:
        batch_op.drop_column('drops')
        batch_op.drop_column('pid')

    with op.batch_alter_table('collectives', schema=None) as batch_op:
        batch_op.drop_column('members')

    with op.batch_alter_table('actions', schema=None) as batch_op:
        batch_op.drop_column('deliveries')

