"""Create, list, revoke and verify API tokens.

>>> token, secret = create_token(session=s, name="ci", scopes=["read"])   # doctest: +SKIP
>>> secret            # shown once; only its SHA-256 is stored          # doctest: +SKIP
'vgl_…'
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass

from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from backend.auth.models import SCOPES, ApiToken
from backend.db import session_scope, utcnow
from backend.errors import Invalid

TOKEN_PREFIX = "vgl_"


@dataclass(frozen=True)
class Principal:
    """Who is calling: a token's name and its scopes (``admin`` implies all)."""

    name: str
    scopes: frozenset[str]

    def has(self, scope: str) -> bool:
        return scope in self.scopes or "admin" in self.scopes


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def normalize_scopes(scopes: Iterable[str]) -> list[str]:
    wanted = sorted({s.strip() for s in scopes if s.strip()})
    unknown = [s for s in wanted if s not in SCOPES]
    if unknown or not wanted:
        raise Invalid(f"scopes must be a non-empty subset of {', '.join(SCOPES)}; got {unknown}")
    return wanted


def create_token(*, session: Session, name: str, scopes: Iterable[str]) -> tuple[ApiToken, str]:
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    row = ApiToken(
        name=name,
        token_hash=hash_token(secret),
        prefix=secret[:10],
        scopes=" ".join(normalize_scopes(scopes)),
    )
    session.add(row)
    session.flush()
    return row, secret


def list_tokens(*, session: Session) -> list[ApiToken]:
    return list(session.scalars(select(ApiToken).order_by(ApiToken.id)))


def revoke_token(*, session: Session, token_id: int) -> ApiToken | None:
    """Revoke the token (again is a no-op: the first time stays); ``None`` if unknown."""
    row = session.get(ApiToken, token_id)
    if row is not None and row.revoked_at is None:
        row.revoked_at = utcnow()
        session.flush()
    return row


class TokenVerifier:
    """Checks bearer tokens: bootstrap tokens from settings, then the database.

    A verified database token is trusted for ``cache_s`` seconds, so the ingest hot path
    does not look it up on every batch; revocation takes effect within that time.
    """

    def __init__(
        self,
        factory: sessionmaker[Session],
        bootstrap: dict[str, frozenset[str]],
        cache_s: float = 10.0,
    ) -> None:
        self._factory = factory
        self._bootstrap = list(bootstrap.items())
        self._cache_s = cache_s
        self._cache: dict[str, tuple[float, Principal | None]] = {}
        self._lock = threading.Lock()

    def verify(self, token: str) -> Principal | None:
        for known, scopes in self._bootstrap:
            if hmac.compare_digest(known.encode(), token.encode()):
                return Principal("bootstrap", scopes)
        if not token.startswith(TOKEN_PREFIX):
            return None
        digest = hash_token(token)
        now = time.monotonic()
        with self._lock:
            hit = self._cache.get(digest)
        if hit is not None and now - hit[0] < self._cache_s:
            return hit[1]
        principal = self._lookup(digest)
        with self._lock:
            if len(self._cache) > 10_000:
                self._cache.clear()
            self._cache[digest] = (now, principal)
        return principal

    def _lookup(self, digest: str) -> Principal | None:
        with session_scope(self._factory, write=True) as session:
            row = session.scalar(select(ApiToken).where(ApiToken.token_hash == digest))
            if row is None or row.revoked_at is not None:
                return None
            session.execute(
                update(ApiToken).where(ApiToken.id == row.id).values(last_used_at=utcnow())
            )
            return Principal(row.name, frozenset(row.scopes.split()))
