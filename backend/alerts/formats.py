"""Webhook payloads, built from an incident with no I/O: Alertmanager, Slack, generic JSON.

    >>> body = build("alertmanager", incident=row, job="llama-8b", status="firing",
    ...              receiver="oncall", public_url="https://vigil.example", now=utcnow())
    >>> body["alerts"][0]["labels"]["alertname"]
    'VigilStraggler'
    >>> data = encode(body)        # the exact bytes to send (and to sign)

The generic format is signed as the Standard Webhooks spec says (standardwebhooks.com):

    >>> secret = new_secret()                                  # 'whsec_…'
    >>> headers = signing_headers(secret, "msg_1", data, timestamp=1732233000)
    >>> verify(secret, "msg_1", "1732233000", data, headers["webhook-signature"],
    ...        now=1732233000)
    True
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import math
import secrets
import time
from datetime import UTC, datetime
from typing import Any

from backend.incidents.models import Incident

ZERO_TIME = "0001-01-01T00:00:00Z"  # Alertmanager's endsAt of an alert still firing
SLACK_TEXT_LIMIT = 3000  # characters in one section block's text
SECRET_PREFIX = "whsec_"
SIGNATURE_TOLERANCE_S = 300  # Standard Webhooks: refuse timestamps further off than this


def rfc3339(value: datetime) -> str:
    """``2024-11-22T00:10:00.5Z`` — UTC with a ``Z``, as Go and Alertmanager write it."""
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def incident_url(public_url: str, incident_id: int) -> str:
    return f"{public_url.rstrip('/')}/incidents/{incident_id}"


def alertname(kind: str) -> str:
    """``loss_spike`` → ``VigilLossSpike``."""
    return "Vigil" + "".join(part.capitalize() for part in kind.split("_"))


def alert_fingerprint(incident_fingerprint: str) -> str:
    """16 hex characters, stable for the incident's fingerprint (like Alertmanager's)."""
    return hashlib.sha256(incident_fingerprint.encode()).hexdigest()[:16]


def format_ranks(ranks: list[int] | None, limit: int = 200) -> str:
    """Ranks as compact ranges: ``[0, 1, 2, 3, 7]`` → ``0-3,7`` (cut at ``limit`` chars)."""
    runs: list[list[int]] = []
    for r in sorted(set(ranks or [])):
        if runs and r == runs[-1][1] + 1:
            runs[-1][1] = r
        else:
            runs.append([r, r])
    text = ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def jsonable(value: Any) -> Any:
    """Plain JSON values: datetimes as RFC 3339, NaN/±Inf as strings (JSON has neither)."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, datetime):
        return rfc3339(value)
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set):
        return [jsonable(v) for v in value]
    return value


def encode(payload: dict[str, Any]) -> bytes:
    """The request body: deterministic (sorted keys, no spaces), so every retry sends, and
    the signature covers, the same bytes."""
    return json.dumps(
        payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode()


def _description(incident: Incident, job: str) -> str:
    bits = [f"{incident.kind} on job {job}"]
    if incident.ranks:
        bits.append(f"ranks {format_ranks(incident.ranks)}")
    if incident.first_step is not None:
        bits.append(f"since step {incident.first_step}")
    if incident.score is not None and math.isfinite(incident.score):
        bits.append(f"score {incident.score:.2f}")
    return ", ".join(bits)


def alert_labels(incident: Incident, job: str) -> dict[str, str]:
    """An incident's Alertmanager labels (also what receivers group by)."""
    return {
        "alertname": alertname(incident.kind),
        "job": job,
        "kind": incident.kind,
        "severity": incident.severity,
        "ranks": format_ranks(incident.ranks),
        "incident_id": str(incident.id),
        "source": "vigil",
    }


def alertmanager_alert(
    *, incident: Incident, job: str, status: str, public_url: str, now: datetime
) -> dict[str, Any]:
    """One alert of an Alertmanager payload's ``alerts`` list."""
    annotations = {
        "summary": incident.summary or _description(incident, job),
        "description": _description(incident, job),
    }
    ends = incident.resolved_at or now
    return {
        "status": status,
        "labels": alert_labels(incident, job),
        "annotations": annotations,
        "startsAt": rfc3339(incident.detected_at),
        "endsAt": rfc3339(ends) if status == "resolved" else ZERO_TIME,
        "generatorURL": incident_url(public_url, incident.id),
        "fingerprint": alert_fingerprint(incident.fingerprint),
    }


def alertmanager(
    *,
    incident: Incident,
    job: str,
    status: str,
    receiver: str,
    public_url: str,
    now: datetime,
) -> dict[str, Any]:
    """Alertmanager's webhook payload (version 4) with one alert for the incident, grouped
    by ``alertname``, ``job`` and ``incident_id`` (a group of its own)."""
    alert = alertmanager_alert(
        incident=incident, job=job, status=status, public_url=public_url, now=now
    )
    return alertmanager_group(receiver, public_url, status, [alert])


def _common(dicts: list[dict[str, str]]) -> dict[str, str]:
    """The key/value pairs every dict has (Alertmanager's commonLabels/commonAnnotations)."""
    first, *rest = dicts
    return {k: v for k, v in first.items() if all(d.get(k) == v for d in rest)}


def alertmanager_group(
    receiver: str,
    public_url: str,
    status: str,
    alerts: list[dict[str, Any]],
    group_labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The payload for a group of alerts; ``group_labels`` default to the first alert's
    ``alertname``, ``job`` and ``incident_id`` (a one-incident group)."""
    labels = alerts[0]["labels"]
    if group_labels is None:
        group_labels = {k: labels[k] for k in ("alertname", "job", "incident_id") if k in labels}
    group_key = "{}:{" + ", ".join(f"{k}={json.dumps(v)}" for k, v in group_labels.items()) + "}"
    return {
        "version": "4",
        "groupKey": group_key,
        "truncatedAlerts": 0,
        "status": status,
        "receiver": receiver,
        "groupLabels": dict(group_labels),
        "commonLabels": _common([a["labels"] for a in alerts]),
        "commonAnnotations": _common([a["annotations"] for a in alerts]),
        "externalURL": public_url.rstrip("/"),
        "alerts": alerts,
    }


def slack_escape(text: str) -> str:
    """Slack's control characters: ``&``, ``<`` and ``>`` become HTML entities."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _section(text: str) -> dict[str, Any]:
    return {"type": "section", "text": {"type": "mrkdwn", "text": _cut(text, SLACK_TEXT_LIMIT)}}


def slack(*, incident: Incident, job: str, status: str, public_url: str) -> dict[str, Any]:
    """A Slack incoming-webhook message: fallback ``text`` plus mrkdwn section blocks."""
    resolved = status == "resolved"
    icon = ":white_check_mark:" if resolved else ":rotating_light:"
    word = "Resolved" if resolved else "Firing"
    title = f"{word}: {incident.kind} on {job} ({incident.severity})"
    summary = incident.summary or _description(incident, job)
    fields = [
        ("Job", job),
        ("Kind", incident.kind),
        ("Severity", incident.severity),
        ("Ranks", format_ranks(incident.ranks) or "—"),
        ("First step", "—" if incident.first_step is None else str(incident.first_step)),
        ("Status", incident.status),
    ]
    link = incident_url(public_url, incident.id)
    return {
        "text": slack_escape(f"[Vigil] {title}: {summary}")[:SLACK_TEXT_LIMIT],
        "blocks": [
            _section(f"{icon} *{slack_escape(title)}*\n{slack_escape(summary)}"),
            {
                "type": "section",
                "fields": [
                    {"type": "mrkdwn", "text": _cut(f"*{k}*\n{slack_escape(v)}", 2000)}
                    for k, v in fields
                ],
            },
            _section(f"<{link}|Open incident #{incident.id} in Vigil>"),
        ],
    }


def incident_data(incident: Incident, job: str, public_url: str) -> dict[str, Any]:
    """The incident as the generic format's ``data`` (the REST API's fields, plus a URL)."""
    data: dict[str, Any] = jsonable(
        {
            "id": incident.id,
            "job": job,
            "kind": incident.kind,
            "severity": incident.severity,
            "status": incident.status,
            "ranks": list(incident.ranks or []),
            "first_step": incident.first_step,
            "score": incident.score,
            "summary": incident.summary,
            "evidence": incident.evidence or {},
            "fingerprint": incident.fingerprint,
            "detected_at": incident.detected_at,
            "updated_at": incident.updated_at,
            "resolved_at": incident.resolved_at,
            "url": incident_url(public_url, incident.id),
        }
    )
    return data


def generic(
    *, incident: Incident, job: str, status: str, public_url: str, now: datetime
) -> dict[str, Any]:
    """Standard Webhooks body: ``{"type": "incident.firing", "timestamp", "data"}``."""
    return {
        "type": f"incident.{status}",
        "timestamp": rfc3339(now),
        "data": incident_data(incident, job, public_url),
    }


def build(
    fmt: str,
    *,
    incident: Incident,
    job: str,
    status: str,
    receiver: str,
    public_url: str,
    now: datetime,
) -> dict[str, Any]:
    """The payload for a receiver format; ``status`` is ``firing`` or ``resolved``."""
    if fmt == "alertmanager":
        return alertmanager(
            incident=incident,
            job=job,
            status=status,
            receiver=receiver,
            public_url=public_url,
            now=now,
        )
    if fmt == "slack":
        return slack(incident=incident, job=job, status=status, public_url=public_url)
    if fmt == "generic":
        return generic(incident=incident, job=job, status=status, public_url=public_url, now=now)
    raise ValueError(f"unknown receiver format {fmt!r}")


def build_test_payload(
    fmt: str, *, receiver: str, public_url: str, now: datetime
) -> dict[str, Any]:
    """What ``POST /webhooks/{id}/test`` sends: clearly a test, in the receiver's format."""
    text = f"Test notification from Vigil to receiver {receiver!r}; no incident is open."
    if fmt == "alertmanager":
        alert = {
            "status": "firing",
            "labels": {"alertname": "VigilTest", "severity": "info", "source": "vigil"},
            "annotations": {"summary": text, "description": text},
            "startsAt": rfc3339(now),
            "endsAt": ZERO_TIME,
            "generatorURL": public_url.rstrip("/") + "/",
            "fingerprint": alert_fingerprint(f"test:{receiver}"),
        }
        return alertmanager_group(receiver, public_url, "firing", [alert])
    if fmt == "slack":
        return {"text": slack_escape(text), "blocks": [_section(f":wave: {slack_escape(text)}")]}
    if fmt == "generic":
        return {"type": "test", "timestamp": rfc3339(now), "data": {"receiver": receiver}}
    raise ValueError(f"unknown receiver format {fmt!r}")


def new_secret(nbytes: int = 32) -> str:
    """A fresh Standard Webhooks secret: ``whsec_`` + base64 of random bytes."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(nbytes)).decode()


def secret_key(secret: str) -> bytes:
    """The HMAC key: the base64 after the ``whsec_`` prefix, decoded.

    Raises ``ValueError`` for a secret that is not ``whsec_<base64>``."""
    if not secret.startswith(SECRET_PREFIX):
        raise ValueError("a signing secret starts with 'whsec_'")
    try:
        key = base64.b64decode(secret[len(SECRET_PREFIX) :], validate=True)
    except ValueError:
        raise ValueError("a signing secret is 'whsec_' followed by base64") from None
    if not 16 <= len(key) <= 64:
        raise ValueError("a signing secret's key must be 16 to 64 bytes")
    return key


def sign(secret: str, msg_id: str, timestamp: int | str, body: bytes) -> str:
    """``v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">`` (the webhook-signature)."""
    signed = f"{msg_id}.{timestamp}.".encode() + body
    digest = hmac.new(secret_key(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def signing_headers(
    secret: str | None, msg_id: str, body: bytes, *, timestamp: int | None = None
) -> dict[str, str]:
    """``webhook-id``, ``webhook-timestamp`` and (with a secret) ``webhook-signature``."""
    ts = int(time.time()) if timestamp is None else timestamp
    headers = {"webhook-id": msg_id, "webhook-timestamp": str(ts)}
    if secret:
        headers["webhook-signature"] = sign(secret, msg_id, ts, body)
    return headers


def verify(
    secret: str,
    msg_id: str,
    timestamp: str,
    body: bytes,
    signature_header: str,
    *,
    now: float | None = None,
    tolerance_s: float = SIGNATURE_TOLERANCE_S,
) -> bool:
    """Check a request as a receiver would: any ``v1`` signature in the (space-separated)
    header matches, and the timestamp is within ``tolerance_s`` of ``now``."""
    try:
        ts = int(timestamp)
    except ValueError:
        return False
    current = time.time() if now is None else now
    if abs(current - ts) > tolerance_s:
        return False
    expected = sign(secret, msg_id, ts, body).encode()
    return any(
        hmac.compare_digest(expected, candidate.encode())
        for candidate in signature_header.split()
        if candidate.startswith("v1,")
    )
