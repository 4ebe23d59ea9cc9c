"""Tokens over REST: create (shown once), list (never secrets), revoke. Admin only."""

from __future__ import annotations

from typing import get_args

import pytest

from backend.auth.models import SCOPES
from backend.auth.schemas import Scope
from backend.auth.service import list_tokens
from tests.conftest import ADMIN, INGEST
from tests.factories import batch, step

API = "/api/v1/tokens"
LISTED = {"id", "name", "prefix", "scopes", "created_at", "last_used_at", "revoked_at"}


def create(client, name: str = "ranks", scopes: list[str] | None = None):  # type: ignore[no-untyped-def]
    body = {"name": name, "scopes": scopes if scopes is not None else ["ingest"]}
    return client.post(API, json=body, headers=ADMIN)


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def test_created_token_works_for_its_scope_only(client):
    reply = create(client, "ranks", ["ingest"])
    assert reply.status_code == 201, reply.text
    assert reply.headers["cache-control"] == "no-store"
    body = reply.json()
    assert set(body) == LISTED | {"token"}
    assert body["name"] == "ranks" and body["scopes"] == ["ingest"]
    assert body["token"].startswith(body["prefix"]) and body["revoked_at"] is None
    auth = bearer(body["token"])
    assert client.post("/api/v1/ingest", json=batch([step(1)]), headers=auth).status_code == 200
    assert client.get("/api/v1/jobs", headers=auth).status_code == 403
    assert client.get(API, headers=auth).status_code == 403


def test_scopes_are_deduplicated_and_sorted(client):
    body = create(client, "both", ["read", "ingest", "read"]).json()
    assert body["scopes"] == ["ingest", "read"]


def test_list_shows_no_secrets(client, session):
    first = create(client, "ranks", ["ingest"]).json()
    second = create(client, "grafana", ["read"]).json()
    reply = client.get(API, headers=ADMIN)
    assert reply.status_code == 200
    listed = reply.json()
    assert [t["name"] for t in listed] == ["ranks", "grafana"]
    assert all(set(t) == LISTED for t in listed)
    for secret in (first["token"], second["token"]):
        assert secret not in reply.text
    hashes = {row.token_hash for row in list_tokens(session=session)}
    assert not any(h in reply.text for h in hashes)
    used = next(t for t in listed if t["name"] == "ranks")
    assert used["last_used_at"] is None


def test_revoked_token_is_refused(client):
    body = create(client).json()
    auth = bearer(body["token"])
    assert client.post("/api/v1/ingest", json=batch([step(1)]), headers=auth).status_code == 200

    assert client.delete(f"{API}/{body['id']}", headers=ADMIN).status_code == 204
    reply = client.post("/api/v1/ingest", json=batch([step(2)]), headers=auth)
    assert reply.status_code == 401  # the test app caches tokens for 0 s
    assert reply.json()["detail"] == "invalid or revoked token"
    (row,) = [t for t in client.get(API, headers=ADMIN).json() if t["id"] == body["id"]]
    assert row["revoked_at"] is not None and row["last_used_at"] is not None


def test_revoking_twice_is_idempotent(client):
    token_id = create(client).json()["id"]
    assert client.delete(f"{API}/{token_id}", headers=ADMIN).status_code == 204
    first = client.get(API, headers=ADMIN).json()[0]["revoked_at"]
    again = client.delete(f"{API}/{token_id}", headers=ADMIN)
    assert again.status_code == 204 and again.content == b""
    assert client.get(API, headers=ADMIN).json()[0]["revoked_at"] == first


def test_unknown_token_is_404(client):
    reply = client.delete(f"{API}/424242", headers=ADMIN)
    assert reply.status_code == 404
    assert reply.json() == {"error": "not_found", "status": 404, "detail": "token 424242 not found"}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"name": "x", "scopes": ["ingest", "superuser"]}, "scopes[1]"),
        ({"name": "x", "scopes": []}, "scopes"),
        ({"name": "x", "scopes": "admin"}, "scopes"),
        ({"name": "   ", "scopes": ["read"]}, "name"),
        ({"name": "x" * 129, "scopes": ["read"]}, "name"),
        ({"scopes": ["read"]}, "name"),
        ({"name": "x", "scopes": ["read"], "expires": "never"}, "expires"),
    ],
)
def test_bad_input_is_422_naming_the_field(client, body, field):
    reply = client.post(API, json=body, headers=ADMIN)
    assert reply.status_code == 422, reply.text
    payload = reply.json()
    assert (payload["error"], payload["status"]) == ("invalid", 422)
    assert field in {e["field"] for e in payload["detail"]}
    assert client.get(API, headers=ADMIN).json() == []  # nothing was created


@pytest.mark.parametrize(("method", "path"), [("GET", API), ("POST", API), ("DELETE", f"{API}/1")])
def test_only_admin_tokens(client, method, path):
    reader = bearer(create(client, "grafana", ["read"]).json()["token"])
    kwargs = {"json": {"name": "x", "scopes": ["admin"]}} if method == "POST" else {}
    for headers in (reader, INGEST):
        reply = client.request(method, path, headers=headers, **kwargs)
        assert reply.status_code == 403
        assert reply.json()["error"] == "forbidden"
    reply = client.request(method, path, **kwargs)
    assert reply.status_code == 401 and reply.headers["www-authenticate"] == "Bearer"
    listed = client.get(API, headers=ADMIN).json()
    assert [(t["name"], t["revoked_at"]) for t in listed] == [("grafana", None)]


def test_api_scopes_are_the_models_scopes():
    assert get_args(Scope) == SCOPES
