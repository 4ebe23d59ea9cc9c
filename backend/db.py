"""Database plumbing shared by every domain: the declarative base, engines and sessions.

Services receive a ``Session`` and only ``flush()``; whoever opened the session (the
request dependency, a task wrapper, the CLI) commits or rolls back, so work that spans
services is one transaction.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from operator import itemgetter
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    DateTime,
    Double,
    Engine,
    Integer,
    MetaData,
    create_engine,
    event,
    insert,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import DeclarativeBase, Session, sessionmaker
from sqlalchemy.types import TypeDecorator

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


# Autoincrementing 64-bit keys; SQLite only autoincrements a column typed INTEGER.
BigId = BigInteger().with_variant(Integer(), "sqlite")


def utcnow() -> datetime:
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on every backend (SQLite keeps no zone)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> Any:
        if value is not None and value.tzinfo is None:
            raise ValueError("naive datetime: pass an aware one (backend.db.utcnow())")
        return value

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is not None and value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value


class NonFiniteFloat(TypeDecorator[float]):
    """A double that keeps NaN and ±Inf on every backend.

    PostgreSQL stores them natively; SQLite turns NaN into NULL, which would hide the
    very NaN loss a detector looks for, so there it is stored as the text ``'NaN'``.
    """

    impl = Double
    cache_ok = True

    def bind_processor(self, dialect: Any) -> Any:
        if dialect.name != "sqlite":
            return super().bind_processor(dialect)

        # Replaces (not wraps) the float coercion SQLite's Double applies, which would
        # turn the text back into a NaN float and so into NULL.
        def process(value: Any) -> Any:
            if isinstance(value, float) and math.isnan(value):
                return "NaN"
            return value

        return process

    def process_result_value(self, value: Any, dialect: Any) -> float | None:
        if value is None:
            return None
        return float(value)  # float("NaN") parses the SQLite text form


def make_engine(url: str, *, pool_size: int = 10) -> Engine:
    """Create an engine with the settings each backend needs for concurrent ingest."""
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"timeout": 30, "check_same_thread": False})
        _configure_sqlite(engine)
        return engine
    return create_engine(
        url,
        pool_size=pool_size,
        max_overflow=pool_size,
        pool_timeout=10,
        pool_pre_ping=True,
    )


def _configure_sqlite(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Let SQLAlchemy, not pysqlite, decide when transactions begin (savepoints
        # and rollbacks then behave as on PostgreSQL).
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        # Writers take the write lock up front: a deferred transaction that reads and
        # then writes fails at once with SQLITE_BUSY when another writer got there first,
        # instead of waiting out busy_timeout.
        immediate = conn.get_execution_options().get(WRITE_TRANSACTION, False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


# Execution option for sessions that will write: ``session.connection(execution_options=
# {WRITE_TRANSACTION: True})``. Only SQLite looks at it.
WRITE_TRANSACTION = "vigil_write_transaction"


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(bind=engine, expire_on_commit=False, autoflush=False)


@contextmanager
def session_scope(factory: sessionmaker[Session], *, write: bool = False) -> Iterator[Session]:
    """One unit of work: commit on success, roll back on any error."""
    session = factory()
    try:
        if write:
            session.connection(execution_options={WRITE_TRANSACTION: True})
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


def insert_for(session: Session, table: Any) -> Any:
    """A dialect-specific INSERT that supports ``on_conflict_do_*`` and ``excluded``."""
    name = session.get_bind().dialect.name
    if name == "postgresql":
        return postgresql.insert(table)
    if name == "sqlite":
        return sqlite.insert(table)
    raise RuntimeError(f"unsupported database dialect {name!r}")


def bulk_insert(session: Session, table: Any, rows: list[dict[str, Any]]) -> None:
    """Insert many rows in the session's transaction, as fast as the database allows.

    PostgreSQL: ``COPY … FROM STDIN`` on the session's own connection (executemany there
    sends one INSERT per row). SQLite: executemany, which is fast in-process.
    Every row must have the same keys.
    """
    if not rows:
        return
    if session.get_bind().dialect.name != "postgresql":
        session.execute(insert(table), rows)
        return
    from psycopg.types.json import Json

    columns = list(rows[0])
    json_columns = {c.name for c in table.columns if isinstance(c.type, JSON)}
    raw = session.connection().connection.driver_connection
    assert raw is not None, "the session has no live DBAPI connection"
    quoted = ", ".join(f'"{c}"' for c in columns)
    with raw.cursor() as cursor, cursor.copy(f'COPY "{table.name}" ({quoted}) FROM STDIN') as copy:
        if json_columns:
            for row in rows:
                copy.write_row(
                    [
                        Json(row[c]) if c in json_columns and row[c] is not None else row[c]
                        for c in columns
                    ]
                )
        else:
            for row in rows:
                copy.write_row([row[c] for c in columns])


def unique_rounds(
    rows: list[dict[str, Any]], *, key: tuple[str, ...]
) -> list[list[dict[str, Any]]]:
    """``rows`` for upserts that may meet a key only once per statement (PostgreSQL's ON
    CONFLICT DO UPDATE): the first row of each key, then the second of the keys that
    have one, and so on; each round sorted by ``key``. Run in turn, the rounds change a
    key's row in the order its rows came, as one statement per batch would; a key in a
    later round is in the first one, so sorting keeps one lock order for every writer.

    >>> [[r["n"] for r in part] for part in unique_rounds(
    ...     [{"k": 2, "n": 0}, {"k": 1, "n": 1}, {"k": 2, "n": 2}], key=("k",))]
    [[1, 0], [2]]
    """
    of = itemgetter(*key)
    rounds: list[list[dict[str, Any]]] = []
    seen: dict[Any, int] = {}
    for row in rows:
        k = of(row)
        n = seen.get(k, 0)
        seen[k] = n + 1
        if n == len(rounds):
            rounds.append([])
        rounds[n].append(row)
    return [sorted(part, key=of) for part in rounds]


def add_sums(
    session: Session, model: Any, *, keys: list[str], sums: list[str], rows: list[dict[str, Any]]
) -> None:
    """Upsert ``rows`` into a rollup table, adding their ``sums`` columns to a row with the
    same ``keys`` (or inserting it). Rows are written in key order: one lock order for
    every writer, so concurrent batches never deadlock."""
    if not rows:
        return
    stmt = insert_for(session, model)
    table = model.__table__.c
    stmt = stmt.on_conflict_do_update(
        index_elements=keys,
        set_={c: table[c] + getattr(stmt.excluded, c) for c in sums},
    )
    session.execute(stmt, sorted(rows, key=lambda r: tuple(r[k] for k in keys)))
