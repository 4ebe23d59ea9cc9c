"""The webhooks API: CRUD with secrets kept secret, validation, the test button, the log."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from backend.alerts import formats
from backend.alerts.views import router
from backend.auth.service import create_token
from tests.backend.alerts.conftest import T0, make_incident
from tests.conftest import ADMIN

API = "/api/v1/webhooks"
SLACK = "https://hooks.slack.com/services/T000/B000/XXXXSECRETXXXX"


@pytest.fixture
def api(app):  # type: ignore[no-untyped-def]
    """The app's client, with this router mounted if backend/api.py does not mount it yet."""
    if "/api/v1/webhooks" not in {getattr(r, "path", None) for r in app.routes}:
        app.include_router(router)
    with TestClient(app) as c:
        yield c


def create(api, **body):  # type: ignore[no-untyped-def]
    return api.post(
        API, json={"name": "oncall", "url": "http://am.example:9093/hook", **body}, headers=ADMIN
    )


def test_create_list_get_update_delete(api):
    reply = create(api, kinds=["hang", "straggler"], severities=["critical"], jobs=["llama-8b"])
    assert reply.status_code == 201, reply.text
    rx = reply.json()
    assert rx["format"] == "alertmanager" and rx["has_secret"] is False and rx["secret"] is None
    assert (rx["kinds"], rx["severities"], rx["jobs"]) == (
        ["hang", "straggler"],
        ["critical"],
        ["llama-8b"],
    )
    assert (rx["send_resolved"], rx["repeat_interval_s"], rx["enabled"]) == (True, 14400, True)
    assert [r["id"] for r in api.get(API, headers=ADMIN).json()] == [rx["id"]]
    one = api.get(f"{API}/{rx['id']}", headers=ADMIN).json()
    assert one["name"] == "oncall" and "secret" not in one
    patched = api.patch(
        f"{API}/{rx['id']}",
        json={"kinds": None, "enabled": False, "repeat_interval_s": 60},
        headers=ADMIN,
    )
    assert patched.status_code == 200, patched.text
    assert (
        patched.json()["kinds"],
        patched.json()["enabled"],
        patched.json()["repeat_interval_s"],
    ) == (None, False, 60)
    assert patched.json()["severities"] == ["critical"]  # unchanged: not sent
    assert api.delete(f"{API}/{rx['id']}", headers=ADMIN).status_code == 204
    gone = api.get(f"{API}/{rx['id']}", headers=ADMIN)
    assert gone.status_code == 404 and str(rx["id"]) in gone.json()["detail"]


def test_generic_secret_is_shown_once_and_never_again(api):
    reply = create(api, format="generic", headers={"Authorization": "Bearer hunter2-token"})
    assert reply.status_code == 201, reply.text
    secret = reply.json()["secret"]
    assert secret.startswith("whsec_") and formats.secret_key(secret)
    assert reply.json()["has_secret"] is True
    rid = reply.json()["id"]
    for text in (
        api.get(API, headers=ADMIN).text,
        api.get(f"{API}/{rid}", headers=ADMIN).text,
        api.patch(f"{API}/{rid}", json={"enabled": True}, headers=ADMIN).text,
        api.get(f"{API}/{rid}/deliveries", headers=ADMIN).text,
    ):
        assert secret not in text and secret.removeprefix("whsec_") not in text
        assert "hunter2-token" not in text
    assert api.get(f"{API}/{rid}", headers=ADMIN).json()["header_names"] == ["Authorization"]
    # A secret the caller chose is not echoed back.
    own = formats.new_secret()
    mine = create(api, name="own", format="generic", secret=own).json()
    assert mine["secret"] is None and mine["has_secret"] is True
    # Rotation: send a new one; it is stored, not shown.
    rotated = api.patch(f"{API}/{rid}", json={"secret": own}, headers=ADMIN)
    assert rotated.status_code == 200 and own not in rotated.text


def test_credentials_in_urls_are_masked(api):
    slack = create(api, name="chat", format="slack", url=SLACK).json()
    assert "XXXXSECRET" not in slack["url"] and slack["url"].startswith(
        "https://hooks.slack.com/services/"
    )
    basic = create(
        api, name="basic", url="https://bot:pa55word@am.example/hook?token=abc&x=1"
    ).json()
    assert "pa55word" not in basic["url"] and "abc" not in basic["url"]
    assert basic["url"] == "https://bot:***@am.example/hook?token=***&x=***"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"url": "ftp://am.example/hook"}, "url"),
        ({"url": "not a url"}, "url"),
        ({"format": "email"}, "format"),
        ({"kinds": ["straggler", "gremlins"]}, "kinds"),
        ({"severities": ["apocalyptic"]}, "severities"),
        ({"secret": "hunter2"}, "secret"),
        ({"repeat_interval_s": -1}, "repeat_interval_s"),
        ({"headers": {"Bad Header": "x"}}, "headers"),
        ({"name": ""}, "name"),
        ({"colour": "red"}, "colour"),
    ],
)
def test_bad_input_is_422_naming_the_field(api, body, field):
    reply = create(api, **body)
    assert reply.status_code == 422, reply.text
    assert field in {str(part) for err in reply.json()["detail"] for part in err["loc"]}


def test_bad_update_is_422_naming_the_field(api):
    rid = create(api).json()["id"]
    reply = api.patch(f"{API}/{rid}", json={"url": None}, headers=ADMIN)
    assert reply.status_code == 422 and "url" in reply.json()["detail"]
    reply = api.patch(f"{API}/{rid}", json={"format": "generic"}, headers=ADMIN)
    assert reply.status_code == 422 and reply.json()["detail"].startswith("secret")
    reply = api.patch(f"{API}/{rid}", json={"kinds": ["gremlins"]}, headers=ADMIN)
    assert reply.status_code == 422 and "kinds" in str(reply.json()["detail"])


def test_duplicate_names_conflict(api):
    assert create(api).status_code == 201
    dup = create(api)
    assert dup.status_code == 409 and "oncall" in dup.json()["detail"]
    other = create(api, name="other").json()
    clash = api.patch(f"{API}/{other['id']}", json={"name": "oncall"}, headers=ADMIN)
    assert clash.status_code == 409
    same = api.patch(f"{API}/{other['id']}", json={"name": "other"}, headers=ADMIN)
    assert same.status_code == 200


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("get", "/424242"),
        ("patch", "/424242"),
        ("delete", "/424242"),
        ("post", "/424242/test"),
        ("get", "/424242/deliveries"),
    ],
)
def test_unknown_receiver_is_404_naming_the_id(api, method, path):
    kwargs = {"json": {}} if method == "patch" else {}
    reply = api.request(method.upper(), API + path, headers=ADMIN, **kwargs)
    assert reply.status_code == 404 and "424242" in reply.json()["detail"]


def test_scopes(api, session):
    _, reader = create_token(session=session, name="grafana", scopes=["read"])
    session.commit()
    read = {"Authorization": f"Bearer {reader}"}
    assert api.get(API).status_code == 401
    assert api.get(API, headers=read).status_code == 200
    assert create(api).status_code == 201
    assert api.post(API, json={"name": "x", "url": "http://a/b"}, headers=read).status_code == 403
    assert api.post(f"{API}/1/test", headers=read).status_code == 403
    assert api.delete(f"{API}/1", headers=read).status_code == 403


def test_test_endpoint_sends_now_and_logs_it(api, receiver_server):
    rid = create(api, url=receiver_server.url, format="generic").json()["id"]
    reply = api.post(f"{API}/{rid}/test", headers=ADMIN)
    assert reply.status_code == 200, reply.text
    delivery = reply.json()
    assert (delivery["status"], delivery["state"], delivery["response_code"]) == (
        "test",
        "delivered",
        200,
    )
    assert delivery["attempts"] == 1 and delivery["incident_id"] is None
    [req] = receiver_server.requests
    assert req.body == formats.encode(delivery["payload"])
    assert req.headers["webhook-id"] == delivery["webhook_id"]

    receiver_server.answer(500)
    failed = api.post(f"{API}/{rid}/test", headers=ADMIN).json()
    # A test is tried once: the person who pressed the button sees the outcome.
    assert (failed["state"], failed["response_code"]) == ("failed", 500)
    assert "receiver says no" in failed["error"]
    log = api.get(f"{API}/{rid}/deliveries", headers=ADMIN).json()
    assert [d["id"] for d in log] == [failed["id"], delivery["id"]]  # newest first
    assert {"state", "attempts", "response_code", "error", "next_attempt_at"} <= set(log[0])


def test_test_endpoint_with_a_receiver_that_is_down(api, settings):
    from tests.servers import free_port

    rid = create(api, url=f"http://127.0.0.1:{free_port()}/hook").json()["id"]
    delivery = api.post(f"{API}/{rid}/test", headers=ADMIN).json()
    assert delivery["state"] == "failed" and "ConnectError" in delivery["error"]


def test_deliveries_log_shows_incident_notifications(api, session):
    from backend.alerts.service import notify_changes

    rid = create(api).json()["id"]
    row = make_incident(session)
    notify_changes(session=session, opened=[row], resolved=[], now=T0, public_url="http://v")
    session.commit()
    [entry] = api.get(f"{API}/{rid}/deliveries", headers=ADMIN).json()
    assert (entry["incident_id"], entry["status"], entry["state"]) == (row.id, "firing", "pending")
