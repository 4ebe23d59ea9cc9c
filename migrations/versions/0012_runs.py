"""job runs: each launch of a job name is a run with a state; ranks keep their exit code

New table ``runs`` (one row per launch of a job: its key, number, kind, the job-wide
attempt its attempt 0 is stored as, state running/finished/failed/lost, when and why it
ended, when its incidents and actions were settled). ``jobs.run_id`` points at the
current run; ``ranks.exit_code`` holds the code a rank's goodbye carried. Every existing
job gets one run (``run-1``, first attempt 0, still running), so nothing stored moves.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-24
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from backend.db import UTCDateTime

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "runs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("key", sa.String(length=128), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("first_attempt", sa.Integer(), nullable=False),
        sa.Column("started_at", UTCDateTime(timezone=True), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("ended_at", UTCDateTime(timezone=True), nullable=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("closed_at", UTCDateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_runs_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_runs")),
        sa.UniqueConstraint("job_id", "key", name=op.f("uq_runs_job_id_key")),
        sa.UniqueConstraint("job_id", "number", name=op.f("uq_runs_job_id_number")),
    )
    # Plain ALTER TABLE, not batch mode: SQLite would rebuild ``jobs`` by dropping it, and
    # with foreign keys on that deletes every row that references a job.
    op.add_column("jobs", sa.Column("run_id", sa.Integer(), nullable=True))
    op.add_column("ranks", sa.Column("exit_code", sa.Integer(), nullable=True))
    op.execute(
        "INSERT INTO runs (job_id, key, number, kind, first_attempt, started_at, state, reason)"
        " SELECT id, 'run-1', 1, kind, 0, created_at, 'running', '' FROM jobs"
    )
    op.execute("UPDATE jobs SET run_id = (SELECT runs.id FROM runs WHERE runs.job_id = jobs.id)")


def downgrade() -> None:
    op.drop_column("ranks", "exit_code")  # SQLite 3.35+ drops a plain column in place
    op.drop_column("jobs", "run_id")
    op.drop_table("runs")
