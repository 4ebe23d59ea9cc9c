"""Day partitions of the raw telemetry tables on PostgreSQL: ``steps`` and ``collectives``.

Both are declaratively partitioned by RANGE on ``ts`` (epoch seconds: the rank's clock for a
step, the server's receive time for a collective), one partition per UTC day, named by
its date, plus a DEFAULT partition, so an insert never fails for lack of a partition::

    steps                       PARTITION BY RANGE (ts), primary key (id, ts)
    ├── steps_p20261124         FOR VALUES FROM (1795478400) TO (1795564800)
    ├── steps_p20261125         …
    └── steps_default           DEFAULT: a day not made yet, a far past or future clock

Old raw rows go by dropping a whole day (no DELETE, no vacuum debt); rows that landed in
DEFAULT are moved into their day's partition when it is made (``add_day``). Each
partition carries the parent's indexes: the B-trees the detectors and pages use
(job, step, rank) and a BRIN on ``ts`` (``brin_<table>_ts``), tiny on append-ordered time.

The partitions and the BRIN indexes exist on PostgreSQL only: SQLite keeps plain tables.
They are not in the models, so ``include_name`` keeps Alembic's autogenerate from taking
them for drift. ``backend.telemetry.retention`` decides which days to add and drop.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

from sqlalchemy import Connection, text

PARTITIONED = ("steps", "collectives")
DAY_S = 86_400
# Locks are taken with this timeout: a partition is made or dropped in milliseconds once
# the lock is held, so waiting longer would only queue ingest behind the DDL. A run that
# times out tries again at the next one.
LOCK_TIMEOUT = "3s"

_PARTITION = re.compile(r"^(?:steps|collectives)_(?:p(\d{8})|default)$")


def is_partition(name: str) -> bool:
    """Whether ``name`` is one of the partitions this module makes."""
    return _PARTITION.match(name) is not None


def include_name(name: str | None, type_: str, parent_names: object) -> bool:
    """Alembic ``include_name`` hook: leave out what exists on PostgreSQL only and is kept
    by migration 0014 and this module, not by the models (partitions, BRIN indexes)."""
    if name is None:
        return True
    if type_ == "table":
        return not is_partition(name)
    if type_ == "index":
        return not name.startswith("brin_")
    return True


def day_of(ts: float) -> int:
    """The UTC day (days since the epoch) that holds epoch second ``ts``."""
    return int(ts // DAY_S)


def partition_name(table: str, day: int) -> str:
    return f"{table}_p{datetime.fromtimestamp(day * DAY_S, UTC):%Y%m%d}"


def default_name(table: str) -> str:
    return f"{table}_default"


def _day_from_name(table: str, name: str) -> int | None:
    match = _PARTITION.match(name)
    if match is None or match.group(1) is None or not name.startswith(table + "_"):
        return None
    date = datetime.strptime(match.group(1), "%Y%m%d").replace(tzinfo=UTC)
    return day_of(date.timestamp())


def is_partitioned(conn: Connection, table: str) -> bool:
    """Whether ``table`` is a partitioned table here (never on SQLite)."""
    if conn.dialect.name != "postgresql":
        return False
    kind = conn.scalar(
        text("SELECT relkind FROM pg_class WHERE oid = to_regclass(:t)"), {"t": table}
    )
    return bool(kind == "p")


def day_partitions(conn: Connection, table: str) -> dict[int, str]:
    """The day partitions attached to ``table``: {day: name}."""
    names = conn.scalars(
        text(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = CAST(:t AS regclass)"
        ),
        {"t": table},
    )
    days = {}
    for name in names:
        day = _day_from_name(table, name)
        if day is not None:
            days[day] = name
    return days


def create_default(conn: Connection, table: str) -> None:
    conn.execute(text(f'CREATE TABLE "{default_name(table)}" PARTITION OF "{table}" DEFAULT'))


def create_indexes(conn: Connection, table: str, btrees: dict[str, tuple[str, ...]]) -> None:
    """The primary key (which must hold the partition key), ``btrees`` ({name: columns}) and
    the BRIN on ``ts``, on the parent: PostgreSQL builds them on every partition, present
    and future."""
    conn.execute(text(f'ALTER TABLE "{table}" ADD CONSTRAINT "pk_{table}" PRIMARY KEY (id, ts)'))
    for name, columns in btrees.items():
        cols = ", ".join(f'"{c}"' for c in columns)
        conn.execute(text(f'CREATE INDEX "{name}" ON "{table}" ({cols})'))
    conn.execute(text(f'CREATE INDEX "brin_{table}_ts" ON "{table}" USING brin (ts)'))


def _columns(conn: Connection, table: str) -> str:
    names = conn.scalars(
        text(
            "SELECT attname FROM pg_attribute WHERE attrelid = CAST(:t AS regclass) "
            "AND attnum > 0 AND NOT attisdropped ORDER BY attnum"
        ),
        {"t": table},
    )
    return ", ".join(f'"{n}"' for n in names)


def add_day(conn: Connection, table: str, day: int) -> int:
    """Make ``day``'s partition of ``table`` and move the rows DEFAULT holds for that day
    into it; returns how many moved. Run it in its own transaction: it holds the DEFAULT
    partition exclusively until commit.

    Made as a plain table and then attached, which locks the parent only against other
    schema changes (``CREATE TABLE … PARTITION OF`` would lock out every reader and
    writer). DEFAULT is locked first, so no insert lands there for the day between the
    move and the attach (which would make the attach fail)."""
    name, default = partition_name(table, day), default_name(table)
    lo, hi = day * DAY_S, (day + 1) * DAY_S
    conn.execute(text(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'"))
    conn.execute(text(f'LOCK TABLE "{table}" IN SHARE UPDATE EXCLUSIVE MODE'))
    conn.execute(text(f'LOCK TABLE "{default}" IN ACCESS EXCLUSIVE MODE'))
    conn.execute(text(f'CREATE TABLE "{name}" (LIKE "{table}" INCLUDING DEFAULTS)'))
    cols = _columns(conn, table)
    moved = conn.execute(
        text(
            f'WITH moved AS (DELETE FROM "{default}" WHERE ts >= :lo AND ts < :hi '
            f'RETURNING {cols}) INSERT INTO "{name}" ({cols}) SELECT {cols} FROM moved'
        ),
        {"lo": lo, "hi": hi},
    ).rowcount
    conn.execute(
        text(f'ALTER TABLE "{table}" ATTACH PARTITION "{name}" FOR VALUES FROM ({lo}) TO ({hi})')
    )
    return int(moved or 0)


def drop_day(conn: Connection, table: str, day: int) -> None:
    """Drop ``day``'s partition of ``table``, rows and all (a brief exclusive lock on the
    parent, taken with ``LOCK_TIMEOUT``)."""
    conn.execute(text(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'"))
    conn.execute(text(f'DROP TABLE IF EXISTS "{partition_name(table, day)}"'))


def default_days(conn: Connection, table: str, *, lo: float, hi: float) -> list[int]:
    """The days in ``[lo, hi)`` of the rows DEFAULT holds (rows that came before their
    day's partition was made)."""
    days = conn.scalars(
        text(
            f'SELECT DISTINCT CAST(floor(ts / {DAY_S}) AS bigint) FROM "{default_name(table)}" '
            "WHERE ts >= :lo AND ts < :hi"
        ),
        {"lo": lo, "hi": hi},
    )
    return sorted(int(d) for d in days)
