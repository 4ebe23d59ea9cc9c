"""time-partitioned raw telemetry on PostgreSQL: steps and collectives by day on ts

``collectives`` gains ``ts`` (epoch seconds the server stored it; not in the ingest
contract), on both databases. On PostgreSQL ``steps`` and ``collectives`` become tables
partitioned by RANGE on ``ts``, one partition per UTC day plus a DEFAULT one
(``backend.telemetry.partitions``), their primary key ``(id, ts)`` (it must hold the
partition key), their B-tree indexes as before plus a BRIN on ``ts``. Rows are kept: each
table is renamed aside, the partitioned one made under its name with the partitions its
rows' days need (the last year's; rows of other days go to DEFAULT) and today's and the
next ``AHEAD_DAYS``', the rows copied over, the old table dropped, its id sequence
handed to the new one. A collective stored before this gets the time of its rank's step
(the newest of that step number), else the migration's.

Downgrade makes plain tables again, rows kept, ``collectives.ts`` gone. SQLite keeps plain
tables: only the column is added (set to the migration's time) and dropped.

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-24
"""

import time
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from backend.telemetry import partitions

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

AHEAD_DAYS = 3
BACK_DAYS = 366
# The B-tree indexes of each table, as revisions 0001-0013 made them.
BTREES: dict[str, dict[str, tuple[str, ...]]] = {
    "steps": {
        "ix_steps_job_step": ("job_id", "step", "rank"),
        "ix_steps_job_rank_step": ("job_id", "rank", "step"),
    },
    "collectives": {"ix_collectives_job_step": ("job_id", "step", "rank")},
}
# What a collective's ``ts`` is when an insert does not say (COPY from ingest).
NOW_EPOCH = "extract(epoch from now())"


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        op.add_column(
            "collectives",
            sa.Column(
                "ts", sa.Double(), nullable=False, server_default=sa.text(f"{time.time():.3f}")
            ),
        )
        return
    for table in partitions.PARTITIONED:
        _set_aside(table)
    op.execute("CREATE TABLE steps (LIKE steps_plain INCLUDING DEFAULTS) PARTITION BY RANGE (ts)")
    op.execute(
        "CREATE TABLE collectives (LIKE collectives_plain INCLUDING DEFAULTS, "
        f"ts double precision NOT NULL DEFAULT {NOW_EPOCH}) PARTITION BY RANGE (ts)"
    )
    conn = op.get_bind()
    today = partitions.day_of(time.time())
    days = set(range(today, today + AHEAD_DAYS + 1)) | {
        int(d)
        for d in conn.scalars(
            sa.text(
                f"SELECT DISTINCT CAST(floor(ts / {partitions.DAY_S}) AS bigint) "
                "FROM steps_plain WHERE ts >= :lo AND ts < :hi"
            ),
            {
                "lo": (today - BACK_DAYS) * partitions.DAY_S,
                "hi": (today + AHEAD_DAYS + 1) * partitions.DAY_S,
            },
        )
    }
    for table in partitions.PARTITIONED:
        partitions.create_default(conn, table)
        for day in sorted(days):
            lo, hi = day * partitions.DAY_S, (day + 1) * partitions.DAY_S
            op.execute(
                f'CREATE TABLE "{partitions.partition_name(table, day)}" PARTITION OF "{table}" '
                f"FOR VALUES FROM ({lo}) TO ({hi})"
            )
    op.execute("INSERT INTO steps SELECT * FROM steps_plain")
    op.execute(
        "INSERT INTO collectives SELECT c.*, "
        f"coalesce(s.ts, {NOW_EPOCH}) FROM collectives_plain c LEFT JOIN "
        "(SELECT job_id, rank, step, max(ts) AS ts FROM steps_plain "
        "GROUP BY job_id, rank, step) s "
        "ON s.job_id = c.job_id AND s.rank = c.rank AND s.step = c.step"
    )
    for table in partitions.PARTITIONED:
        _take_over(table)
        partitions.create_indexes(conn, table, BTREES[table])


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        op.drop_column("collectives", "ts")
        return
    for table in partitions.PARTITIONED:
        op.execute(f'ALTER TABLE "{table}" RENAME TO "{table}_parted"')
        op.execute(f'ALTER SEQUENCE "{table}_id_seq" OWNED BY NONE')
    op.execute("CREATE TABLE steps (LIKE steps_parted INCLUDING DEFAULTS)")
    op.execute("INSERT INTO steps SELECT * FROM steps_parted")
    op.execute("CREATE TABLE collectives (LIKE collectives_parted INCLUDING DEFAULTS)")
    op.execute("ALTER TABLE collectives DROP COLUMN ts")
    op.execute(
        'INSERT INTO collectives SELECT id, job_id, rank, attempt, step, "group", op, seq, '
        "bytes, duration_s, count, members FROM collectives_parted"
    )
    for table in partitions.PARTITIONED:
        op.execute(f'DROP TABLE "{table}_parted"')  # its partitions with it
        op.execute(f'ALTER SEQUENCE "{table}_id_seq" OWNED BY "{table}".id')
        op.execute(f'ALTER TABLE "{table}" ADD CONSTRAINT "pk_{table}" PRIMARY KEY (id)')
        for name, columns in BTREES[table].items():
            cols = ", ".join(f'"{c}"' for c in columns)
            op.execute(f'CREATE INDEX "{name}" ON "{table}" ({cols})')


def _set_aside(table: str) -> None:
    """Rename the plain table out of the way; its sequence stops belonging to it, so
    dropping it later leaves the sequence to the new table."""
    op.execute(f'ALTER TABLE "{table}" RENAME TO "{table}_plain"')
    op.execute(f'ALTER SEQUENCE "{table}_id_seq" OWNED BY NONE')


def _take_over(table: str) -> None:
    op.execute(f'DROP TABLE "{table}_plain"')  # its indexes with it: the names are free
    op.execute(f'ALTER SEQUENCE "{table}_id_seq" OWNED BY "{table}".id')
