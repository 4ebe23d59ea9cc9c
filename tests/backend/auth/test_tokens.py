"""API tokens: stored hashed, scoped, revocable."""

from __future__ import annotations

import pytest
from sqlalchemy import select, update

from backend.auth.models import ApiToken
from backend.auth.service import TokenVerifier, create_token, hash_token, revoke_token
from backend.db import utcnow
from tests.factories import batch, step


def test_only_the_hash_is_stored(session):
    row, secret = create_token(session=session, name="ci", scopes=["ingest"])
    stored = session.scalars(select(ApiToken)).one()
    assert secret.startswith("vgl_") and len(secret) > 40
    assert stored.token_hash == hash_token(secret) != secret
    assert secret not in {stored.token_hash, stored.prefix, stored.name}
    assert row.scopes == "ingest"


def test_unknown_scope_is_refused(session):
    with pytest.raises(ValueError, match="scopes must be"):
        create_token(session=session, name="x", scopes=["superuser"])


def test_created_token_works_until_revoked(client, session):
    row, secret = create_token(session=session, name="rank-0", scopes=["ingest"])
    session.commit()
    auth = {"Authorization": f"Bearer {secret}"}
    assert client.post("/api/v1/ingest", json=batch([step(1)]), headers=auth).status_code == 200
    # An ingest token cannot read.
    assert client.get("/api/v1/jobs", headers=auth).status_code == 403

    revoke_token(session=session, token_id=row.id)
    session.commit()
    reply = client.post("/api/v1/ingest", json=batch([step(2)]), headers=auth)
    assert reply.status_code == 401  # the test app caches tokens for 0 s


def test_verifier_caches_within_its_window(session_factory, session):
    row, secret = create_token(session=session, name="t", scopes=["read"])
    session.commit()
    verifier = TokenVerifier(session_factory, {}, cache_s=3600)
    assert verifier.verify(secret) is not None
    # Revoked behind this process's back (another replica): cached until cache_s passes.
    session.execute(update(ApiToken).where(ApiToken.id == row.id).values(revoked_at=utcnow()))
    session.commit()
    assert verifier.verify(secret) is not None
    assert TokenVerifier(session_factory, {}, cache_s=0).verify(secret) is None
    # Revoked through the service in this process: forgotten as soon as it commits.
    row2, secret2 = create_token(session=session, name="t2", scopes=["read"])
    session.commit()
    assert verifier.verify(secret2) is not None
    revoke_token(session=session, token_id=row2.id)
    session.commit()
    assert verifier.verify(secret2) is None


def test_admin_implies_every_scope(client):
    admin = {"Authorization": "Bearer vigil-dev-admin"}
    assert client.post("/api/v1/ingest", json=batch([step(1)]), headers=admin).status_code == 200
    assert client.get("/api/v1/jobs", headers=admin).status_code == 200
