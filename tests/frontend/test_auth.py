"""Signing in, scopes, and CSRF: every form post needs the page's token, every change the
admin scope; production pages need a sign-in."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from backend.actions.models import Action
from backend.api import create_app
from backend.auth.service import create_token
from backend.settings import Settings
from backend.ui.auth import safe_next
from tests.frontend.helpers import csrf_of

PROD_ADMIN = "prod-admin-token-0123456789"


def approve_url(straggler) -> str:  # type: ignore[no-untyped-def]
    return f"/ui/actions/{straggler['action'].id}/approve"


def state(session, straggler) -> str:  # type: ignore[no-untyped-def]
    session.expire_all()
    return session.get(Action, straggler["action"].id).state


def test_approve_with_the_csrf_token(client, session, straggler):
    page = client.get(f"/incidents/{straggler['incident'].id}")
    token = csrf_of(page.text)
    reply = client.post(approve_url(straggler), data={"csrf_token": token}, follow_redirects=False)
    assert reply.status_code == 303, reply.text
    assert reply.headers["location"] == f"/incidents/{straggler['incident'].id}?done=approved"
    assert state(session, straggler) == "pending"
    shown = client.get(reply.headers["location"])
    assert "Action approved" in shown.text
    again = client.post(approve_url(straggler), data={"csrf_token": token})
    assert again.status_code == 409 and "only a proposed action" in again.text


@pytest.mark.parametrize(
    "form, headers",
    [
        ({}, {}),  # no token
        ({"csrf_token": "0" * 64}, {}),  # a made-up token
        (None, {"Origin": "https://evil.example"}),  # the right token from another site
    ],
)
def test_posts_without_a_valid_csrf_token_are_refused(client, session, straggler, form, headers):
    page = client.get("/jobs/llama-8b-pretrain")
    body = {"csrf_token": csrf_of(page.text)} if form is None else form
    reply = client.post(approve_url(straggler), data=body, headers=headers)
    assert reply.status_code == 403
    assert "CSRF" in reply.text
    assert state(session, straggler) == "proposed"


def test_a_token_from_another_browser_session_is_refused(app, client, straggler):
    page = f"/incidents/{straggler['incident'].id}"
    token = csrf_of(client.get(page).text)
    with TestClient(app) as other:
        assert csrf_of(other.get(page).text) != token  # its own session id
        reply = other.post(approve_url(straggler), data={"csrf_token": token})
        assert reply.status_code == 403


def test_cancel_and_trigger(client, session, straggler):
    incident = straggler["incident"]
    page = client.get(f"/incidents/{incident.id}")
    token = csrf_of(page.text)
    cancel = client.post(f"/ui/actions/{straggler['action'].id}/cancel", data={"csrf_token": token})
    assert cancel.status_code == 200 and "Action cancelled" in cancel.text
    assert state(session, straggler) == "cancelled"
    form = {
        "csrf_token": token,
        "kind": "dump_stacks",
        "target_ranks": "2",
        "reason": "look at rank 2",
        "incident_id": str(incident.id),
        "nonce": "abc123",
    }
    for _ in range(2):  # a double submit creates one action
        reply = client.post("/ui/jobs/llama-8b-pretrain/actions", data=form, follow_redirects=False)
        assert reply.status_code == 303
    rows = session.query(Action).filter_by(kind="dump_stacks").all()
    assert len(rows) == 1
    assert (rows[0].target_ranks, rows[0].requested_by, rows[0].incident_id) == (
        [2],
        "ui:dev-admin",
        incident.id,
    )
    bad = client.post("/ui/jobs/llama-8b-pretrain/actions", data={**form, "kind": "format_disk"})
    assert bad.status_code == 422


def sign_in(client: TestClient, token: str, next_url: str = "/") -> object:
    page = client.get("/login")
    return client.post(
        "/login",
        data={"csrf_token": csrf_of(page.text), "token": token, "next": next_url},
        follow_redirects=False,
    )


def test_a_read_token_cannot_act(client, session, straggler):
    _, secret = create_token(session=session, name="viewer", scopes=["read"])
    session.commit()
    reply = sign_in(client, secret, "/alerts")
    assert reply.status_code == 303 and reply.headers["location"] == "/alerts"
    cookie = reply.headers["set-cookie"]
    assert "vigil_token=" in cookie and "HttpOnly" in cookie and "samesite=lax" in cookie.lower()
    page = client.get(f"/incidents/{straggler['incident'].id}")
    assert page.status_code == 200
    assert 'data-action="approve"' not in page.text  # no buttons for readers
    assert "viewer" in page.text
    token = csrf_of(page.text)
    reply = client.post(approve_url(straggler), data={"csrf_token": token})
    assert reply.status_code == 403 and "admin" in reply.text
    assert state(session, straggler) == "proposed"
    settings = client.get("/settings")  # admins only
    assert settings.status_code == 403 and 'id="tokens"' not in settings.text


def test_bad_tokens_do_not_sign_in(client, session):
    assert sign_in(client, "nope").status_code == 401
    assert sign_in(client, "vigil-dev-ingest").status_code == 401  # cannot read
    assert "vigil_token" not in client.cookies


def test_only_local_paths_after_sign_in():
    assert safe_next("/jobs/x?y=1") == "/jobs/x?y=1"
    for bad in ("https://evil.example/", "//evil.example", "/\\evil.example", "", None):
        assert safe_next(bad) == "/"


@pytest.fixture
def prod(settings, engine, session_factory):  # type: ignore[no-untyped-def]
    prod_settings = Settings(
        database_url=settings.database_url,
        env="production",
        admin_token=PROD_ADMIN,
        token_cache_s=0,
        detect_interval_s=0,
    )
    app = create_app(prod_settings, engine=engine, session_factory=session_factory)
    with TestClient(app) as c:
        yield c


def test_production_pages_need_a_sign_in(prod, session):
    for url in ("/", "/alerts", "/settings", "/jobs/x", "/incidents/1"):
        reply = prod.get(url, follow_redirects=False)
        assert reply.status_code == 303, url
        assert reply.headers["location"].startswith("/login?next=")
    assert prod.get("/api/v1/jobs/x/heatmap").status_code == 401
    assert prod.get("/login").status_code == 200
    assert sign_in(prod, "vigil-dev-admin").status_code == 401  # no dev tokens here
    reply = sign_in(prod, PROD_ADMIN, "/alerts")
    assert reply.status_code == 303
    assert prod.get("/").status_code == 200
    assert prod.get("/api/v1/jobs/x/heatmap").status_code == 404  # signed in: not found
    page = prod.get("/logout")
    out = prod.post("/logout", data={"csrf_token": csrf_of(page.text)}, follow_redirects=False)
    assert out.status_code == 303
    assert prod.get("/", follow_redirects=False).status_code == 303


def test_revoking_the_token_signs_the_browser_out(prod, session):
    row, secret = create_token(session=session, name="oncall", scopes=["read"])
    session.commit()
    assert sign_in(prod, secret).status_code == 303
    assert prod.get("/").status_code == 200
    from backend.auth.service import revoke_token

    revoke_token(session=session, token_id=row.id)
    session.commit()
    assert prod.get("/", follow_redirects=False).status_code == 303


def test_a_stale_sign_in_is_forgotten_on_the_login_page(prod, session):
    prod.cookies.set("vigil_token", "vgl_revoked-or-made-up")
    assert prod.get("/", follow_redirects=False).status_code == 303
    page = prod.get("/login")
    assert (
        'vigil_token=""' in page.headers["set-cookie"] or "Max-Age=0" in page.headers["set-cookie"]
    )
