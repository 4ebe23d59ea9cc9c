"""Create, list and revoke API tokens (checking them: ``backend.auth.verifier``).

>>> token, secret = create_token(session=s, name="ci", scopes=["read"])   # doctest: +SKIP
>>> secret            # shown once; only its SHA-256 is stored          # doctest: +SKIP
'vgl_…'
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable

from sqlalchemy import event, select
from sqlalchemy.orm import Session

from backend.auth.models import SCOPES, ApiToken
from backend.auth.verifier import TOKEN_PREFIX, Principal, TokenVerifier, forget, hash_token
from backend.db import utcnow
from backend.errors import Invalid

__all__ = [
    "TOKEN_PREFIX",
    "Principal",
    "TokenVerifier",
    "create_token",
    "hash_token",
    "list_tokens",
    "normalize_scopes",
    "revoke_token",
]

# Token hashes changed by a session's transaction: the verifiers of this process forget
# them once it commits, so a revocation works at once (and a rollback changes nothing;
# a hash left over from a rolled-back transaction is at worst looked up again).
_CHANGED = "vigil_auth_changed_tokens"


def _changed(session: Session, digest: str) -> None:
    session.info.setdefault(_CHANGED, set()).add(digest)


@event.listens_for(Session, "after_commit")
def _after_commit(session: Session) -> None:
    for digest in session.info.pop(_CHANGED, ()):
        forget(digest)


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
    _changed(session, row.token_hash)
    return row, secret


def list_tokens(*, session: Session) -> list[ApiToken]:
    return list(session.scalars(select(ApiToken).order_by(ApiToken.id)))


def revoke_token(*, session: Session, token_id: int) -> ApiToken | None:
    """Revoke the token (again is a no-op: the first time stays); ``None`` if unknown."""
    row = session.get(ApiToken, token_id)
    if row is not None and row.revoked_at is None:
        row.revoked_at = utcnow()
        session.flush()
        _changed(session, row.token_hash)
    return row
