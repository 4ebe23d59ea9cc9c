"""Webhook credentials at rest: the database never holds a signing secret or a header
value in clear, yet deliveries are signed with (and carry) the real values."""

from __future__ import annotations

import json
import logging
import stat
from collections.abc import Iterator

import pytest
from sqlalchemy import text

from backend.alerts import formats, sealing
from backend.alerts.models import WebhookDelivery, WebhookReceiver
from backend.alerts.sender import send_one
from backend.alerts.service import create_test_delivery, update_receiver
from backend.settings import Settings, SettingsError, load_settings
from tests.backend.alerts.conftest import make_receiver
from tests.conftest import ADMIN

URL = "https://vigil.example"
BEARER = "Bearer am-s3cret-credential"


@pytest.fixture
def keyring() -> Iterator[None]:
    """Tests that change the process's keyring put the previous one back."""
    before = sealing._keyring
    yield
    sealing._keyring = before


def stored(session, receiver_id: int) -> tuple[str | None, str]:  # type: ignore[no-untyped-def]
    """The raw column values, as another reader of the database sees them."""
    session.flush()
    query = text("SELECT secret, headers FROM webhook_receivers WHERE id = :id")
    secret, headers = session.execute(query, {"id": receiver_id}).one()
    return secret, headers if isinstance(headers, str) else str(headers)


def test_the_api_stores_no_clear_secret(client, session):
    own = formats.new_secret()
    body = {
        "name": "signed",
        "url": "http://127.0.0.1:9/hook",
        "format": "generic",
        "secret": own,
        "headers": {"Authorization": BEARER},
    }
    made = client.post("/api/v1/webhooks", json=body, headers=ADMIN)
    assert made.status_code == 201, made.text
    receiver_id = made.json()["id"]
    secret, headers = stored(session, receiver_id)
    assert secret is not None and secret.startswith("enc:v1:") and own not in secret
    assert BEARER not in headers and "Authorization" in headers  # names stay readable
    assert made.json()["has_secret"] and made.json()["header_names"] == ["Authorization"]

    rotated = formats.new_secret()
    changed = client.patch(
        f"/api/v1/webhooks/{receiver_id}",
        json={"secret": rotated, "headers": {"Authorization": BEARER + "-2"}},
        headers=ADMIN,
    )
    assert changed.status_code == 200, changed.text
    secret, headers = stored(session, receiver_id)
    assert secret is not None and rotated not in secret and own not in secret
    assert "s3cret" not in headers
    session.expire_all()
    row = session.get(WebhookReceiver, receiver_id)
    assert row.secret == rotated and row.headers == {"Authorization": BEARER + "-2"}


def test_a_generated_secret_is_sealed_and_shown_once(client, session):
    body = {"name": "gen", "url": "http://127.0.0.1:9/hook", "format": "generic"}
    made = client.post("/api/v1/webhooks", json=body, headers=ADMIN).json()
    assert made["secret"].startswith("whsec_")
    secret, _ = stored(session, made["id"])
    assert secret is not None and made["secret"] not in secret


def test_deliveries_are_signed_with_the_real_secret(
    session, session_factory, settings, receiver_server
):
    own = formats.new_secret()
    rx = make_receiver(
        session, url=receiver_server.url, format="generic", secret=own, headers={"X-Auth": BEARER}
    )
    delivery = create_test_delivery(session=session, receiver=rx, public_url=URL)
    session.commit()
    assert send_one(session_factory, settings=settings, delivery_id=delivery.id)
    [req] = receiver_server.requests
    assert req.headers["x-auth"] == BEARER
    assert formats.verify(
        own,
        req.headers["webhook-id"],
        req.headers["webhook-timestamp"],
        req.body,
        req.headers["webhook-signature"],
    )


def test_values_stored_in_clear_are_read_then_sealed_on_the_next_change(session):
    rx = make_receiver(session, format="generic", headers={"Authorization": BEARER})
    own = formats.new_secret()
    # As an older version wrote them.
    session.flush()
    session.execute(
        text("UPDATE webhook_receivers SET secret = :s, headers = :h WHERE id = :id"),
        {"s": own, "h": json.dumps({"Authorization": BEARER}), "id": rx.id},
    )
    session.expire_all()
    legacy = session.get(WebhookReceiver, rx.id)
    assert legacy.stored_in_clear
    assert legacy.secret == own and legacy.headers == {"Authorization": BEARER}
    update_receiver(session=session, receiver=legacy, changes={"kinds": ["hang"]})
    secret, headers = stored(session, rx.id)
    assert secret is not None and own not in secret and BEARER not in headers
    session.expire_all()
    assert session.get(WebhookReceiver, rx.id).secret == own


def test_a_key_that_cannot_open_it_fails_the_delivery(
    session, session_factory, settings, receiver_server, keyring
):
    sealing._keyring = sealing.Keyring(["the-first-key-0123456789"], "test")
    rx = make_receiver(session, url=receiver_server.url, format="generic")
    delivery = create_test_delivery(session=session, receiver=rx, public_url=URL)
    session.commit()
    sealing._keyring = sealing.Keyring(["another-key-0123456789"], "test")
    assert not send_one(session_factory, settings=settings, delivery_id=delivery.id)
    assert receiver_server.requests == []  # never sent unsigned
    session.expire_all()
    row = session.get(WebhookDelivery, delivery.id)
    assert row.state == "failed" and "VIGIL_SECRET_KEY" in row.error
    # The old key listed as previous opens it again.
    sealing._keyring = sealing.Keyring(["another-key-0123456789", "the-first-key-0123456789"], "t")
    assert session.get(WebhookReceiver, rx.id).secret.startswith("whsec_")


def test_embedded_keeps_a_generated_key_next_to_the_database(tmp_path):
    url = f"sqlite:///{tmp_path / 'vigil.db'}"
    first = sealing.keyring_for(Settings(database_url=url))
    path = tmp_path / "vigil.db.key"
    assert path.exists() and stat.S_IMODE(path.stat().st_mode) == 0o600
    again = sealing.keyring_for(Settings(database_url=url))  # another process, same key
    assert again.unseal(first.seal("whsec_x")) == "whsec_x"
    configured = sealing.keyring_for(Settings(database_url=url, secret_key="k" * 32))
    with pytest.raises(sealing.SecretUnreadable):
        configured.unseal(first.seal("whsec_x"))
    sealed = first.seal("whsec_x")
    assert sealed != first.seal("whsec_x")  # a fresh nonce each time
    assert first.unseal("whsec_legacy") == "whsec_legacy"


def test_production_without_a_key_warns_and_refuses_placeholders(tmp_path, caplog):
    prod = {"env": "production", "admin_token": "a-long-enough-admin-token", "redis_url": None}
    url = "postgresql+psycopg://vigil@db/vigil"
    with caplog.at_level(logging.WARNING, logger="backend.alerts.sealing"):
        derived = sealing.keyring_for(Settings(database_url=url, **prod))
    assert "VIGIL_SECRET_KEY is not set" in caplog.text
    assert derived.source == "derived from the admin token"
    with pytest.raises(SettingsError, match="VIGIL_SECRET_KEY"):
        load_settings(database_url=url, secret_key="changeme", **prod)
