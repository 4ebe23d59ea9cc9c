"""Payload builders and Standard Webhooks signing: pure functions, no database."""

from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest

from backend.alerts import formats
from backend.incidents.models import Incident
from tests.backend.alerts.conftest import T0

URL = "https://vigil.example"


def incident(**fields):  # type: ignore[no-untyped-def]
    values = dict(
        id=12,
        job_id=1,
        kind="loss_spike",
        severity="critical",
        status="open",
        fingerprint="1:loss_spike",
        ranks=[0, 1, 2, 3, 7],
        first_step=1810,
        score=float("nan"),
        summary="loss jumped <5x> & kept going",
        evidence={"loss": float("inf"), "at": [1, 2]},
        detected_at=T0,
        updated_at=T0,
        resolved_at=None,
    )
    values.update(fields)
    return Incident(**values)


def am(row, status="firing"):  # type: ignore[no-untyped-def]
    return formats.build(
        "alertmanager",
        incident=row,
        job="llama-8b",
        status=status,
        receiver="oncall",
        public_url=URL + "/",
        now=T0 + timedelta(hours=1),
    )


def test_alertmanager_firing_has_every_field_alertmanager_sends():
    body = am(incident())
    assert set(body) == {
        "version",
        "groupKey",
        "truncatedAlerts",
        "status",
        "receiver",
        "groupLabels",
        "commonLabels",
        "commonAnnotations",
        "externalURL",
        "alerts",
    }
    assert (body["version"], body["status"], body["receiver"]) == ("4", "firing", "oncall")
    assert body["truncatedAlerts"] == 0 and body["externalURL"] == URL
    [alert] = body["alerts"]
    assert set(alert) == {
        "status",
        "labels",
        "annotations",
        "startsAt",
        "endsAt",
        "generatorURL",
        "fingerprint",
    }
    assert alert["labels"] == {
        "alertname": "VigilLossSpike",
        "job": "llama-8b",
        "kind": "loss_spike",
        "severity": "critical",
        "ranks": "0-3,7",
        "incident_id": "12",
        "source": "vigil",
    }
    assert all(isinstance(v, str) for v in alert["labels"].values())
    assert all(isinstance(v, str) for v in alert["annotations"].values())
    assert {"summary", "description"} <= set(alert["annotations"])
    assert alert["startsAt"] == "2024-11-22T00:10:00Z"
    assert alert["endsAt"] == "0001-01-01T00:00:00Z"
    assert alert["generatorURL"] == f"{URL}/incidents/12"
    assert re.fullmatch(r"[0-9a-f]{16}", alert["fingerprint"])
    assert body["commonLabels"] == alert["labels"]
    assert body["groupLabels"] == {
        "alertname": "VigilLossSpike",
        "job": "llama-8b",
        "incident_id": "12",
    }
    assert body["groupKey"].startswith("{}:{")
    formats.encode(body)  # plain JSON


def test_alertmanager_resolved_ends_when_the_incident_resolved():
    firing = am(incident())
    ended = T0 + timedelta(minutes=30)
    resolved = am(incident(status="resolved", resolved_at=ended), status="resolved")
    assert resolved["status"] == resolved["alerts"][0]["status"] == "resolved"
    assert resolved["alerts"][0]["endsAt"] == "2024-11-22T00:40:00Z"
    assert resolved["alerts"][0]["startsAt"] == firing["alerts"][0]["startsAt"]
    # Same incident fingerprint → same alert fingerprint and group, whatever the state.
    assert resolved["alerts"][0]["fingerprint"] == firing["alerts"][0]["fingerprint"]
    assert resolved["groupKey"] == firing["groupKey"]
    other = am(incident(fingerprint="1:straggler:6"))
    assert other["alerts"][0]["fingerprint"] != firing["alerts"][0]["fingerprint"]


def test_slack_message_escapes_user_text():
    body = formats.slack(incident=incident(), job="llama<&>", status="firing", public_url=URL)
    assert set(body) == {"text", "blocks"}
    assert "<5x>" not in body["text"] and "&lt;5x&gt; &amp; kept" in body["text"]
    assert all(b["type"] == "section" for b in body["blocks"])
    texts = [b["text"]["text"] for b in body["blocks"] if "text" in b]
    texts += [f["text"] for b in body["blocks"] for f in b.get("fields", [])]
    assert all(t.count("<") == t.count(">") for t in texts)
    assert any(f"<{URL}/incidents/12|" in t for t in texts)
    assert any("llama&lt;&amp;&gt;" in t for t in texts)
    resolved = formats.slack(
        incident=incident(status="resolved"), job="j", status="resolved", public_url=URL
    )
    assert resolved["text"].startswith("[Vigil] Resolved")


def test_generic_body_is_plain_json_with_the_incident():
    body = formats.generic(
        incident=incident(), job="llama-8b", status="firing", public_url=URL, now=T0
    )
    assert body["type"] == "incident.firing" and body["timestamp"] == "2024-11-22T00:10:00Z"
    data = body["data"]
    assert (data["id"], data["job"], data["kind"], data["ranks"]) == (
        12,
        "llama-8b",
        "loss_spike",
        [0, 1, 2, 3, 7],
    )
    assert data["score"] == "NaN" and data["evidence"]["loss"] == "Infinity"
    assert data["url"] == f"{URL}/incidents/12"
    json.loads(formats.encode(body))  # no NaN, no datetimes
    assert formats.encode(body) == formats.encode(json.loads(formats.encode(body)))


@pytest.mark.parametrize("fmt", ["alertmanager", "slack", "generic"])
def test_test_payloads(fmt):
    body = formats.build_test_payload(fmt, receiver="oncall", public_url=URL, now=T0)
    assert "Test" in json.dumps(body) or body.get("type") == "test"
    formats.encode(body)
    with pytest.raises(ValueError):
        formats.build_test_payload("email", receiver="x", public_url=URL, now=T0)


def test_signature_verifies_as_a_receiver_checks_it():
    secret = formats.new_secret()
    assert secret.startswith("whsec_") and len(formats.secret_key(secret)) == 32
    body = formats.encode({"type": "test", "data": {}})
    headers = formats.signing_headers(secret, "msg_1", body, timestamp=1_732_233_000)
    assert headers["webhook-id"] == "msg_1" and headers["webhook-timestamp"] == "1732233000"
    assert headers["webhook-signature"].startswith("v1,")
    ts = headers["webhook-timestamp"]
    sig = headers["webhook-signature"]
    assert formats.verify(secret, "msg_1", ts, body, sig, now=1_732_233_010)
    # Receivers may get several signatures (key rotation); any matching one counts.
    assert formats.verify(secret, "msg_1", ts, body, f"v1,bm9wZQ== {sig}", now=1_732_233_010)
    assert not formats.verify(formats.new_secret(), "msg_1", ts, body, sig, now=1_732_233_010)
    assert not formats.verify(secret, "msg_1", ts, body + b" ", sig, now=1_732_233_010)
    assert not formats.verify(secret, "msg_2", ts, body, sig, now=1_732_233_010)
    assert not formats.verify(secret, "msg_1", ts, body, sig, now=1_732_233_000 + 3600)


def test_signature_matches_the_standard_webhooks_reference_vector():
    # The example in the Standard Webhooks spec and its reference libraries.
    secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    body = b'{"test": 2432232314}'
    assert (
        formats.sign(secret, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body)
        == "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
    )


@pytest.mark.parametrize("bad", ["MfKQ9r8G", "whsec_not base64!", "whsec_AAAA"])
def test_bad_secrets_are_refused(bad):
    with pytest.raises(ValueError):
        formats.secret_key(bad)


def test_ranks_and_names():
    assert formats.format_ranks([7, 0, 1, 2, 3, 9, 10]) == "0-3,7,9-10"
    assert formats.format_ranks([]) == ""
    assert len(formats.format_ranks(list(range(0, 4000, 2)))) == 200
    assert formats.alertname("comm_anomaly") == "VigilCommAnomaly"
