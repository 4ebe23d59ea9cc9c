"""Alert webhooks, recovery policies, audit log, action reasoning

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-22
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op


revision: str = '0005'
down_revision: str | None = '0004'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table('recovery_policies',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('job', sa.String(length=200), nullable=False),
    sa.Column('kind', sa.String(length=32), nullable=False),
    sa.Column('mode', sa.String(length=16), nullable=False),
    sa.Column('actions', sa.JSON(), nullable=True),
    sa.Column('params', sa.JSON(), nullable=False),
    sa.Column('updated_by', sa.String(length=128), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_recovery_policies')),
    sa.UniqueConstraint('job', 'kind', name=op.f('uq_recovery_policies_job_kind'))
    )
    op.create_table('webhook_receivers',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('url', sa.Text(), nullable=False),
    sa.Column('format', sa.String(length=16), nullable=False),
    sa.Column('secret', sa.String(length=200), nullable=True),
    sa.Column('headers', sa.JSON(), nullable=False),
    sa.Column('jobs', sa.JSON(), nullable=True),
    sa.Column('kinds', sa.JSON(), nullable=True),
    sa.Column('severities', sa.JSON(), nullable=True),
    sa.Column('send_resolved', sa.Boolean(), nullable=False),
    sa.Column('repeat_interval_s', sa.Integer(), nullable=False),
    sa.Column('enabled', sa.Boolean(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_webhook_receivers')),
    sa.UniqueConstraint('name', name=op.f('uq_webhook_receivers_name'))
    )
    op.create_table('webhook_deliveries',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('receiver_id', sa.Integer(), nullable=False),
    sa.Column('incident_id', sa.Integer(), nullable=True),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('webhook_id', sa.String(length=64), nullable=False),
    sa.Column('payload', sa.JSON(), nullable=False),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('next_attempt_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('last_attempt_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('response_code', sa.Integer(), nullable=True),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('delivered_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['incident_id'], ['incidents.id'], name=op.f('fk_webhook_deliveries_incident_id_incidents'), ondelete='SET NULL'),
    sa.ForeignKeyConstraint(['receiver_id'], ['webhook_receivers.id'], name=op.f('fk_webhook_deliveries_receiver_id_webhook_receivers'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_webhook_deliveries'))
    )
    with op.batch_alter_table('webhook_deliveries', schema=None) as batch_op:
        batch_op.create_index('ix_webhook_deliveries_receiver_incident', ['receiver_id', 'incident_id'], unique=False)
        batch_op.create_index('ix_webhook_deliveries_state_due', ['state', 'next_attempt_at'], unique=False)

    op.create_table('audit_log',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('job_id', sa.Integer(), nullable=True),
    sa.Column('action_id', sa.Integer(), nullable=True),
    sa.Column('incident_id', sa.Integer(), nullable=True),
    sa.Column('at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('actor', sa.String(length=128), nullable=False),
    sa.Column('event', sa.String(length=32), nullable=False),
    sa.Column('detail', sa.JSON(), nullable=False),
    sa.ForeignKeyConstraint(['action_id'], ['actions.id'], name=op.f('fk_audit_log_action_id_actions'), ondelete='SET NULL'),
    sa.ForeignKeyConstraint(['incident_id'], ['incidents.id'], name=op.f('fk_audit_log_incident_id_incidents'), ondelete='SET NULL'),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], name=op.f('fk_audit_log_job_id_jobs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_audit_log'))
    )
    with op.batch_alter_table('audit_log', schema=None) as batch_op:
        batch_op.create_index('ix_audit_log_job_at', ['job_id', 'at'], unique=False)

    with op.batch_alter_table('actions', schema=None) as batch_op:
        batch_op.add_column(sa.Column('reasoning', sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column('approved_by', sa.String(length=128), nullable=True))



def downgrade() -> None:
    with op.batch_alter_table('actions', schema=None) as batch_op:
        batch_op.drop_column('approved_by')
        batch_op.drop_column('reasoning')

    with op.batch_alter_table('audit_log', schema=None) as batch_op:
        batch_op.drop_index('ix_audit_log_job_at')

    op.drop_table('audit_log')
    with op.batch_alter_table('webhook_deliveries', schema=None) as batch_op:
        batch_op.drop_index('ix_webhook_deliveries_state_due')
        batch_op.drop_index('ix_webhook_deliveries_receiver_incident')

    op.drop_table('webhook_deliveries')
    op.drop_table('webhook_receivers')
    op.drop_table('recovery_policies')
