"""Checking bearer tokens on the hot path: never a write, misses cached, bounded memory.

    verifier = TokenVerifier(factory, settings.bootstrap_tokens(), cache_s=10)
    who = verifier.verify("vgl_…")        # Principal, or None (unknown or revoked)
    verifier.close()                       # at shutdown: writes the pending last-use times

- A lookup is one indexed ``SELECT`` in its own short read transaction, so it never waits
  for (or holds) the write lock the request's own transaction may have (on SQLite a second
  write transaction inside a request used to wait out the 30 s busy timeout).
- Verified tokens are trusted for ``cache_s`` seconds; unknown ones are remembered as
  unknown for as long, in a separate cache, so a flood of made-up tokens costs one lookup
  each and can never push a valid token out. Both caches are LRU-bounded (``max_entries``).
- Revoking a token with ``backend.auth.service.revoke_token`` forgets it in every verifier
  of the process as soon as that transaction commits; a revocation made elsewhere (another
  replica, ``vigil token revoke``) is seen within ``cache_s``.
- ``last_used_at`` is kept in memory and written in batches by a background thread every
  ``usage_flush_s`` seconds (and at ``close()``), each batch in its own short transaction.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import threading
import time
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from datetime import datetime
from typing import Generic, TypeVar

from sqlalchemy import or_, select, update
from sqlalchemy.orm import Session, sessionmaker

from backend.auth.models import ApiToken
from backend.db import session_scope, utcnow

log = logging.getLogger(__name__)

TOKEN_PREFIX = "vgl_"
MAX_ENTRIES = 10_000
USAGE_FLUSH_S = 60.0

V = TypeVar("V")


@dataclass(frozen=True)
class Principal:
    """Who is calling: a token's name and its scopes (``admin`` implies all)."""

    name: str
    scopes: frozenset[str]

    def has(self, scope: str) -> bool:
        return scope in self.scopes or "admin" in self.scopes


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class _Known:
    token_id: int
    principal: Principal


class _Lru(Generic[V]):
    """A small LRU map with a time-to-live per entry. Not thread-safe: callers lock."""

    def __init__(self, max_entries: int) -> None:
        self._max = max_entries
        self._items: OrderedDict[str, tuple[float, V]] = OrderedDict()

    def get(self, key: str, now: float) -> V | None:
        item = self._items.get(key)
        if item is None:
            return None
        if item[0] <= now:
            del self._items[key]
            return None
        self._items.move_to_end(key)
        return item[1]

    def put(self, key: str, value: V, expires: float) -> None:
        self._items[key] = (expires, value)
        self._items.move_to_end(key)
        while len(self._items) > self._max:
            self._items.popitem(last=False)

    def pop(self, key: str) -> None:
        self._items.pop(key, None)

    def __len__(self) -> int:
        return len(self._items)


# Every live verifier of the process, told when a token is revoked or created.
_VERIFIERS: weakref.WeakSet[TokenVerifier] = weakref.WeakSet()


def forget(digest: str) -> None:
    """Drop ``digest`` from every verifier's caches (after a commit that changed it)."""
    for verifier in list(_VERIFIERS):
        verifier.forget(digest)


class TokenVerifier:
    """Checks bearer tokens: bootstrap tokens from settings, then the database."""

    def __init__(
        self,
        factory: sessionmaker[Session],
        bootstrap: dict[str, frozenset[str]],
        cache_s: float = 10.0,
        *,
        max_entries: int = MAX_ENTRIES,
        usage_flush_s: float = USAGE_FLUSH_S,
    ) -> None:
        self._factory = factory
        self._bootstrap = list(bootstrap.items())
        self._cache_s = cache_s
        self._known: _Lru[_Known] = _Lru(max_entries)
        self._unknown: _Lru[bool] = _Lru(max_entries)
        self._lock = threading.Lock()
        self._generation = 0
        self._used: dict[int, datetime] = {}
        self._flush_s = usage_flush_s
        self._flusher: threading.Thread | None = None
        self._stop = threading.Event()
        _VERIFIERS.add(self)

    def verify(self, token: str) -> Principal | None:
        for known, scopes in self._bootstrap:
            if hmac.compare_digest(known.encode(), token.encode()):
                return Principal("bootstrap", scopes)
        if not token.startswith(TOKEN_PREFIX):
            return None
        digest = hash_token(token)
        now = time.monotonic()
        with self._lock:
            hit = self._known.get(digest, now)
            if hit is None and self._unknown.get(digest, now):
                return None
            generation = self._generation
        if hit is None:
            hit = self._lookup(digest)
            with self._lock:
                # Not if a token changed meanwhile: the lookup may predate its revocation.
                if self._cache_s > 0 and generation == self._generation:
                    if hit is None:
                        self._unknown.put(digest, True, now + self._cache_s)
                    else:
                        self._known.put(digest, hit, now + self._cache_s)
            if hit is None:
                return None
        self._note_use(hit.token_id)
        return hit.principal

    def _lookup(self, digest: str) -> _Known | None:
        query = select(ApiToken.id, ApiToken.name, ApiToken.scopes).where(
            ApiToken.token_hash == digest, ApiToken.revoked_at.is_(None)
        )
        with self._factory() as session:  # a read transaction, rolled back on close
            row = session.execute(query).first()
        if row is None:
            return None
        return _Known(row.id, Principal(row.name, frozenset(row.scopes.split())))

    def forget(self, digest: str) -> None:
        with self._lock:
            self._generation += 1
            self._known.pop(digest)
            self._unknown.pop(digest)

    def cached_entries(self) -> int:
        with self._lock:
            return len(self._known) + len(self._unknown)

    # --- last use, recorded off the hot path ------------------------------------------

    def _note_use(self, token_id: int) -> None:
        with self._lock:
            self._used[token_id] = utcnow()
            start = self._flusher is None and self._flush_s > 0 and not self._stop.is_set()
            if start:
                self._flusher = threading.Thread(
                    target=self._flush_loop, name="vigil-token-usage", daemon=True
                )
        if start:
            assert self._flusher is not None
            self._flusher.start()

    def last_used(self, token_id: int) -> datetime | None:
        """When this process last saw the token, if not yet written to the database."""
        with self._lock:
            return self._used.get(token_id)

    def _flush_loop(self) -> None:
        while not self._stop.wait(self._flush_s):
            self.flush_usage()

    def flush_usage(self) -> None:
        """Write the pending last-use times in one short transaction; never raises."""
        with self._lock:
            pending, self._used = self._used, {}
        if not pending:
            return
        try:
            with session_scope(self._factory, write=True) as session:
                for token_id, at in sorted(pending.items()):
                    session.execute(
                        update(ApiToken)
                        .where(
                            ApiToken.id == token_id,
                            or_(ApiToken.last_used_at.is_(None), ApiToken.last_used_at < at),
                        )
                        .values(last_used_at=at)
                    )
        except Exception as exc:  # keep them for the next try; a newer use wins
            log.warning("could not record token use (%s); will retry", type(exc).__name__)
            with self._lock:
                for token_id, at in pending.items():
                    if self._used.get(token_id, at) <= at:
                        self._used[token_id] = at

    def close(self) -> None:
        """Stop the background writer and write what is pending."""
        self._stop.set()
        flusher = self._flusher
        if flusher is not None and flusher is not threading.current_thread():
            flusher.join(timeout=5)
        self.flush_usage()
        _VERIFIERS.discard(self)
