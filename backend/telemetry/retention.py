"""Raw telemetry that ages well: keep day partitions made ahead of time, drop old ones.

The rule, run hourly by beat (``vigil.raw_retention``; embedded mode's ticker too)::

    keep made   the day partitions of today … today + AHEAD_DAYS, and of every day in the
                kept window that DEFAULT holds rows for (they move into it)
    drop        each day partition wholly older than VIGIL_RAW_RETENTION_DAYS

Rows DEFAULT keeps for a day before the kept window (an imported trace profiled weeks ago,
a rank's clock far off) stay there until their job goes: they were acknowledged, and an
upload must not vanish at the next hourly run because of the date inside it.

Only ``steps`` and ``collectives`` (the raw rows) age out this way; their rollups
(``step_rollups``, ``collective_rollups``: what charts over long ranges read) and
everything else stay until the whole job goes (``VIGIL_RETENTION_DAYS``,
``backend.jobs.tasks``). ``VIGIL_RAW_RETENTION_DAYS=0`` keeps raw rows for ever; days
are still made ahead.

PostgreSQL only. On SQLite (embedded mode on a laptop) the tables are plain and this is a
no-op: raw rows stay until their job is deleted, since a DELETE by time there would scan
the whole table (it has no index on time) while ingest waits for the one write lock.

Each partition is made or dropped in its own short transaction, so one that cannot get
its lock in time (``partitions.LOCK_TIMEOUT``) is logged and left for the next run, and
never holds up the others, nor ingest for long.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, sessionmaker

from backend.celery_app import redis_lock, runtime, vigil_task
from backend.db import session_scope
from backend.telemetry import partitions
from backend.telemetry.partitions import DAY_S, PARTITIONED, day_of

log = logging.getLogger(__name__)

# Days made ahead of today: ingest keeps landing in a day partition though beat is down for
# this long (after that, in DEFAULT, from where the next run moves the rows).
AHEAD_DAYS = 3
# With raw retention off, DEFAULT's rows of the last this many days are still moved into
# day partitions; older ones (a clock far in the past) stay in DEFAULT.
ADOPT_BACK_DAYS = 366


@dataclass
class Report:
    """What one run did, per ``table`` name in the lists' entries."""

    made: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    moved: int = 0  # rows moved from DEFAULT into their day
    failed: list[str] = field(default_factory=list)


def maintain(
    *,
    factory: sessionmaker[Session],
    retention_days: float,
    now: float | None = None,
    ahead_days: int = AHEAD_DAYS,
) -> Report:
    """Make the day partitions ahead, adopt DEFAULT's rows, drop what is past retention.

    Idempotent: a second run at the same ``now`` does nothing. A no-op report on SQLite.
    """
    now = time.time() if now is None else now
    report = Report()
    with session_scope(factory) as session:
        conn = session.connection()
        if not all(partitions.is_partitioned(conn, t) for t in PARTITIONED):
            return report
        existing = {t: partitions.day_partitions(conn, t) for t in PARTITIONED}
        cutoff = now - retention_days * DAY_S if retention_days > 0 else None
        lo = cutoff if cutoff is not None else now - ADOPT_BACK_DAYS * DAY_S
        hi = (day_of(now) + ahead_days + 1) * DAY_S
        wanted = {
            t: sorted(
                set(range(day_of(now), day_of(now) + ahead_days + 1))
                | set(partitions.default_days(conn, t, lo=lo, hi=hi))
            )
            for t in PARTITIONED
        }

    for table in PARTITIONED:
        for day in wanted[table]:
            if day in existing[table] or (cutoff is not None and (day + 1) * DAY_S <= cutoff):
                continue
            name = partitions.partition_name(table, day)

            def add(conn: Connection, table: str = table, day: int = day) -> None:
                report.moved += partitions.add_day(conn, table, day)

            if _step(factory, f"make {name}", add, report):
                report.made.append(name)
        if cutoff is None:
            continue
        for day, name in sorted(existing[table].items()):
            if (day + 1) * DAY_S > cutoff:
                continue

            def drop(conn: Connection, table: str = table, day: int = day) -> None:
                partitions.drop_day(conn, table, day)

            if _step(factory, f"drop {name}", drop, report):
                report.dropped.append(name)
    return report


def _step(
    factory: sessionmaker[Session],
    what: str,
    work: Callable[[Connection], None],
    report: Report,
) -> bool:
    """Run ``work`` in a transaction of its own; a database error (a lock timeout, a
    partition another run made meanwhile) is logged and recorded, not raised."""
    try:
        with session_scope(factory) as session:
            work(session.connection())
        return True
    except DBAPIError as exc:
        log.warning("raw retention: could not %s: %s", what, exc.orig or exc)
        report.failed.append(what)
        return False


@vigil_task("raw_retention", time_limit_s=1800)
def raw_retention() -> None:
    rt = runtime()
    if rt.settings.is_sqlite:
        return
    with redis_lock("raw_retention", ttl_s=1800) as got:
        if not got:
            return
        report = maintain(factory=rt.factory, retention_days=rt.settings.raw_retention_days)
        if report.made or report.dropped or report.failed:
            log.info(
                "raw retention: made %s, dropped %s, moved %d DEFAULT rows%s",
                report.made or "none",
                report.dropped or "none",
                report.moved,
                f", failed: {report.failed}" if report.failed else "",
            )
