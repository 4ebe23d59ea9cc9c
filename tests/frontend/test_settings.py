"""Settings: webhook receivers, recovery policies and API tokens, changed by admins only."""

from __future__ import annotations

from backend.alerts.models import WebhookReceiver
from backend.auth.models import ApiToken
from backend.auth.service import create_token
from backend.recovery.models import RecoveryPolicy
from tests.frontend.helpers import csrf_of


def token_of(client) -> str:  # type: ignore[no-untyped-def]
    return csrf_of(client.get("/settings").text)


def test_receivers_add_test_delete(client, session):
    csrf = token_of(client)
    form = {"csrf_token": csrf, "name": "oncall", "url": "http://127.0.0.1:9/hook"}
    added = client.post("/ui/webhooks", data={**form, "kinds": "hang, crash"})
    assert added.status_code == 200 and "Webhook receiver added" in added.text
    receiver = session.query(WebhookReceiver).filter_by(name="oncall").one()
    receiver_id = receiver.id
    assert receiver.kinds == ["crash", "hang"]
    generic = client.post("/ui/webhooks", data={**form, "name": "audit", "format": "generic"})
    assert generic.status_code == 200 and 'id="new-secret"' in generic.text
    secret = session.query(WebhookReceiver).filter_by(name="audit").one().secret
    assert secret and secret in generic.text
    assert generic.headers["cache-control"] == "no-store"
    assert secret not in client.get("/settings").text  # shown once
    assert client.post("/ui/webhooks", data=form).status_code == 409  # name taken
    bad = client.post("/ui/webhooks", data={**form, "name": "x", "url": "ftp://nope"})
    assert bad.status_code == 422
    tested = client.post(f"/ui/webhooks/{receiver_id}/test", data={"csrf_token": csrf})
    assert tested.status_code == 200 and 'id="test-result"' in tested.text
    assert "failed" in tested.text  # nothing listens on port 9
    gone = client.post(f"/ui/webhooks/{receiver_id}/delete", data={"csrf_token": csrf})
    assert gone.status_code == 200 and "Webhook receiver deleted" in gone.text
    session.expire_all()
    assert session.get(WebhookReceiver, receiver_id) is None


def test_policies(client, session):
    csrf = token_of(client)
    form = {"csrf_token": csrf, "job": "llama", "kind": "straggler", "mode": "auto"}
    saved = client.post("/ui/policies", data={**form, "params": '{"allow_evict": true}'})
    assert saved.status_code == 200 and "Recovery policy saved" in saved.text
    row = session.query(RecoveryPolicy).filter_by(job="llama", kind="straggler").one()
    assert (row.mode, row.params, row.updated_by) == ("auto", {"allow_evict": True}, "ui:dev-admin")
    assert client.post("/ui/policies", data={**form, "mode": "sometimes"}).status_code == 422
    assert client.post("/ui/policies", data={**form, "params": "[1]"}).status_code == 422


def test_tokens_create_shows_the_secret_once_and_revoke(client, session):
    csrf = token_of(client)
    made = client.post("/ui/tokens", data={"csrf_token": csrf, "name": "ci", "scope_read": "1"})
    assert made.status_code == 200 and 'id="new-token"' in made.text
    row = session.query(ApiToken).filter_by(name="ci").one()
    assert row.scopes == "read"
    secret = made.text.split('id="new-token"')[1].split("<code")[1].split(">")[1].split("<")[0]
    assert secret.startswith("vgl_") and secret[:10] == row.prefix
    assert secret not in client.get("/settings").text
    assert client.post("/ui/tokens", data={"csrf_token": csrf, "name": "none"}).status_code == 422
    revoked = client.post(f"/ui/tokens/{row.id}/revoke", data={"csrf_token": csrf})
    assert revoked.status_code == 200 and "Token revoked" in revoked.text
    session.expire_all()
    assert session.get(ApiToken, row.id).revoked_at is not None


def test_readers_cannot_change_settings(client, session):
    _, secret = create_token(session=session, name="viewer", scopes=["read"])
    session.commit()
    headers = {"Authorization": f"Bearer {secret}"}
    page = client.get("/settings", headers=headers)  # admins only (receivers, tokens)
    assert page.status_code == 403 and 'id="add-receiver"' not in page.text
    csrf = csrf_of(client.get("/settings").text)
    for url, form in [
        ("/ui/webhooks", {"name": "x", "url": "http://127.0.0.1:9/"}),
        ("/ui/policies", {"job": "*", "kind": "*", "mode": "off"}),
        ("/ui/tokens", {"name": "x", "scope_admin": "1"}),
    ]:
        reply = client.post(url, data={"csrf_token": csrf, **form}, headers=headers)
        assert reply.status_code == 403, url
    assert session.query(WebhookReceiver).count() == 0
