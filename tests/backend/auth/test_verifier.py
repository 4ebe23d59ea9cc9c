"""The token verifier on the hot path: no writes, misses cached, bounded, revocation at once.

These tests use a real engine (real commits, real ``BEGIN IMMEDIATE`` on SQLite) and count
the SQL statements the verifier sends, so they say what happens per request, not how long.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, delete, event, select, update
from sqlalchemy.orm import Session, sessionmaker

from backend.auth.models import ApiToken
from backend.auth.service import TokenVerifier, create_token, revoke_token
from backend.db import make_sessionmaker, session_scope, utcnow

WRITES = ("INSERT", "UPDATE", "DELETE", "BEGIN IMMEDIATE")


class Statements:
    """Every SQL statement the engine sends while the test runs."""

    def __init__(self, engine: Engine) -> None:
        self.sql: list[str] = []
        self._engine = engine
        event.listen(engine, "before_cursor_execute", self._on)

    def _on(self, conn, cursor, statement, params, context, many) -> None:  # type: ignore[no-untyped-def]
        self.sql.append(" ".join(statement.split()).upper())

    def close(self) -> None:
        event.remove(self._engine, "before_cursor_execute", self._on)

    def clear(self) -> None:
        self.sql.clear()

    @property
    def writes(self) -> list[str]:
        return [s for s in self.sql if s.startswith(WRITES)]

    @property
    def lookups(self) -> list[str]:
        return [s for s in self.sql if s.startswith("SELECT") and "FROM API_TOKENS" in s]


@pytest.fixture
def factory(engine: Engine) -> Iterator[sessionmaker[Session]]:
    """Sessions that really commit; the tokens made here are deleted afterwards."""
    made = make_sessionmaker(engine)
    yield made
    with session_scope(made, write=True) as session:
        session.execute(delete(ApiToken).where(ApiToken.name.like("verifier-%")))


@pytest.fixture
def statements(engine: Engine) -> Iterator[Statements]:
    recorder = Statements(engine)
    yield recorder
    recorder.close()


def new_token(factory: sessionmaker[Session], scopes: list[str]) -> tuple[int, str]:
    with session_scope(factory, write=True) as session:
        row, secret = create_token(session=session, name="verifier-t", scopes=scopes)
        return row.id, secret


def random_token() -> str:
    return "vgl_" + secrets.token_urlsafe(32)


def test_verifying_never_writes(factory, statements):
    token_id, secret = new_token(factory, ["ingest"])
    verifier = TokenVerifier(factory, {}, cache_s=0)  # no cache: every call looks up
    statements.clear()
    for _ in range(5):
        who = verifier.verify(secret)
        assert who is not None and who.has("ingest") and not who.has("read")
    for _ in range(50):
        assert verifier.verify(random_token()) is None
    assert statements.writes == []
    assert len(statements.lookups) == 55
    # Use is recorded in memory and written later, in its own short transaction.
    assert verifier.last_used(token_id) is not None
    with session_scope(factory) as session:
        assert session.get(ApiToken, token_id).last_used_at is None
    verifier.flush_usage()
    with session_scope(factory) as session:
        assert session.get(ApiToken, token_id).last_used_at is not None
    verifier.close()


def test_a_flood_of_random_tokens_is_looked_up_once_each(factory, statements):
    verifier = TokenVerifier(factory, {}, cache_s=60)
    flood = [random_token() for _ in range(200)]
    statements.clear()
    for _ in range(3):
        for token in flood:
            assert verifier.verify(token) is None
    assert statements.writes == []
    assert len(statements.lookups) == 200  # the repeats are answered from the miss cache
    # Not vgl_ tokens at all: no lookup.
    statements.clear()
    assert verifier.verify("Basic abc") is None
    assert statements.lookups == []


def test_a_flood_cannot_evict_valid_tokens(factory, statements):
    _, secret = new_token(factory, ["read"])
    verifier = TokenVerifier(factory, {}, cache_s=60, max_entries=50)
    assert verifier.verify(secret) is not None
    statements.clear()
    for _ in range(500):
        verifier.verify(random_token())
    assert len(statements.lookups) == 500
    statements.clear()
    assert verifier.verify(secret) is not None
    assert statements.lookups == []  # still cached: misses live in their own bounded cache
    assert verifier.cached_entries() <= 2 * 50


def test_revoking_takes_effect_at_once_in_this_process(factory):
    token_id, secret = new_token(factory, ["read"])
    verifier = TokenVerifier(factory, {}, cache_s=3600)
    assert verifier.verify(secret) is not None
    # A revocation that rolls back changes nothing.
    with pytest.raises(RuntimeError), session_scope(factory, write=True) as session:
        revoke_token(session=session, token_id=token_id)
        raise RuntimeError("rolled back")
    assert verifier.verify(secret) is not None
    with session_scope(factory, write=True) as session:
        revoke_token(session=session, token_id=token_id)
    assert verifier.verify(secret) is None


def test_another_process_revoking_takes_effect_within_the_cache_time(factory):
    token_id, secret = new_token(factory, ["read"])
    cached = TokenVerifier(factory, {}, cache_s=3600)
    uncached = TokenVerifier(factory, {}, cache_s=0)
    assert cached.verify(secret) is not None
    # What `vigil token revoke` in another process does, seen from here: only the row changes.
    with session_scope(factory, write=True) as session:
        session.execute(update(ApiToken).where(ApiToken.id == token_id).values(revoked_at=utcnow()))
    assert cached.verify(secret) is not None  # trusted until VIGIL_TOKEN_CACHE_S passes
    assert uncached.verify(secret) is None


def test_usage_is_flushed_when_the_verifier_closes(factory):
    token_id, secret = new_token(factory, ["ingest"])
    verifier = TokenVerifier(factory, {}, cache_s=10)
    assert verifier.verify(secret) is not None
    verifier.close()
    with session_scope(factory) as session:
        row = session.scalar(select(ApiToken).where(ApiToken.id == token_id))
        assert row is not None and row.last_used_at is not None
