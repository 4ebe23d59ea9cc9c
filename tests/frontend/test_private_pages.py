"""What a reader cannot open, what no cache keeps, and what production hides behind a token:
``/settings`` is for admins; pages and API data are sent with ``Cache-Control: no-store``;
``/metrics`` and the API docs need a token in production unless made public."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from backend.api import create_app
from backend.auth.service import create_token
from backend.settings import Settings
from tests.conftest import ADMIN
from tests.frontend.helpers import csrf_of

PROD_ADMIN = "prod-admin-token-0123456789"
OPS = ("/metrics", "/docs", "/redoc", "/openapi.json")


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_a_reader_cannot_open_settings(client, session):
    _, reader = create_token(session=session, name="viewer", scopes=["read"])
    session.commit()
    page = client.get("/settings", headers=bearer(reader))
    assert page.status_code == 403
    assert "admin" in page.text and "viewer" in page.text
    assert 'id="receivers"' not in page.text and 'id="tokens"' not in page.text
    assert 'id="nav-settings"' not in client.get("/", headers=bearer(reader)).text
    admin = client.get("/settings", headers=ADMIN)
    assert admin.status_code == 200 and 'id="tokens"' in admin.text
    assert 'id="nav-settings"' in admin.text


def test_pages_and_api_data_are_not_stored(client):
    for url in ("/", "/alerts", "/settings", "/jobs/nope", "/login", "/logout"):
        reply = client.get(url, headers=ADMIN)
        assert reply.headers.get("cache-control") == "no-store", url
    for url in ("/api/v1/jobs", "/api/v1/tokens", "/api/v1/webhooks", "/api/v1/jobs/nope"):
        reply = client.get(url, headers=ADMIN)
        assert reply.headers.get("cache-control") == "no-store", url
    # Static files are the same for everyone: cacheable.
    assert client.get("/static/vigil.css").headers.get("cache-control") != "no-store"
    plotly = client.get("/static/plotly.min.js").headers["cache-control"]
    assert plotly.startswith("public")


def test_a_form_post_answer_is_not_stored(client):
    csrf = csrf_of(client.get("/settings").text)
    made = client.post("/ui/tokens", data={"csrf_token": csrf, "name": "ci", "scope_read": "1"})
    assert made.status_code == 200 and made.headers["cache-control"] == "no-store"


def test_metrics_and_docs_are_open_in_development(client):
    for url in OPS:
        assert client.get(url).status_code == 200, url


def prod_client(settings, engine, session_factory, **extra) -> TestClient:  # type: ignore[no-untyped-def]
    prod = Settings(
        database_url=settings.database_url,
        env="production",
        admin_token=PROD_ADMIN,
        token_cache_s=0,
        detect_interval_s=0,
        **extra,
    )
    return TestClient(create_app(prod, engine=engine, session_factory=session_factory))


@pytest.fixture
def prod(settings, engine, session_factory) -> Iterator[TestClient]:  # type: ignore[no-untyped-def]
    with prod_client(settings, engine, session_factory) as c:
        yield c


def test_production_puts_metrics_and_docs_behind_a_token(prod, session):
    _, reader = create_token(session=session, name="prometheus", scopes=["read"])
    _, ingest = create_token(session=session, name="ranks", scopes=["ingest"])
    session.commit()
    for url in OPS:
        anonymous = prod.get(url, follow_redirects=False)
        assert anonymous.status_code == 401, url
        assert anonymous.headers["www-authenticate"] == "Bearer", url
        assert "vigil_" not in anonymous.text
        assert prod.get(url, headers=bearer(ingest)).status_code == 403, url
        allowed = prod.get(url, headers=bearer(reader))
        assert allowed.status_code == 200, url
        assert allowed.headers["cache-control"] == "no-store", url
    assert "vigil_ingest_batches_total" in prod.get("/metrics", headers=bearer(reader)).text
    # Signed in on the dashboard, the docs page and the schema it loads open in the browser.
    page = prod.get("/login")
    signed = prod.post(
        "/login",
        data={"csrf_token": csrf_of(page.text), "token": reader, "next": "/docs"},
        follow_redirects=False,
    )
    assert signed.status_code == 303
    assert prod.get("/docs").status_code == 200
    assert prod.get("/openapi.json").json()["info"]["title"] == "Vigil"


def test_production_can_make_metrics_and_docs_public(settings, engine, session_factory):
    extra = {"metrics_public": True, "docs_public": True}
    with prod_client(settings, engine, session_factory, **extra) as c:
        for url in OPS:
            assert c.get(url).status_code == 200, url
    with prod_client(settings, engine, session_factory, metrics_public=True) as c:
        assert c.get("/metrics").status_code == 200
        assert c.get("/docs").status_code == 401
