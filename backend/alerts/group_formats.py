"""Payloads for a group of incidents (one notification for a job's burst), no I/O.

    >>> body = build_group("alertmanager", incidents=[(row, "llama-8b"), (other, "llama-8b")],
    ...                    status="firing", receiver="oncall", group_labels={"job": "llama-8b"},
    ...                    public_url="https://vigil.example", now=utcnow())
    >>> len(body["alerts"]), body["groupLabels"]
    (2, {'job': 'llama-8b'})

A group of one incident is sent in the shape a single incident always had, for Slack and
the generic format (``backend.alerts.formats.build``); Alertmanager's payload is a group
anyway, with the receiver's group labels. Larger groups:

- ``alertmanager``: one alert per incident, ``groupLabels`` the receiver's ``group_by``
  labels, ``commonLabels``/``commonAnnotations`` what all alerts share;
- ``slack``: one message that lists the incidents (the first ``SLACK_LINES``, then a count);
- ``generic``: ``{"type": "incidents.firing", "timestamp", "data": {"group": {…labels},
  "incidents": [<the single-incident data>, …]}}``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from backend.alerts import formats
from backend.alerts.formats import incident_url, rfc3339, slack_escape
from backend.incidents.models import Incident

SLACK_LINES = 10  # incidents listed by name in one Slack message

Member = tuple[Incident, str]  # an incident and its job's name


def build_group(
    fmt: str,
    *,
    incidents: list[Member],
    status: str,
    receiver: str,
    group_labels: dict[str, str],
    public_url: str,
    now: datetime,
) -> dict[str, Any]:
    """The payload for ``incidents`` (one or more, all with ``status``) in a receiver's
    format; ``ValueError`` for an unknown format or an empty group."""
    if not incidents:
        raise ValueError("a group needs at least one incident")
    if fmt == "alertmanager":
        alerts = [
            formats.alertmanager_alert(
                incident=row, job=job, status=status, public_url=public_url, now=now
            )
            for row, job in incidents
        ]
        return formats.alertmanager_group(receiver, public_url, status, alerts, group_labels)
    if len(incidents) == 1:
        row, job = incidents[0]
        return formats.build(
            fmt,
            incident=row,
            job=job,
            status=status,
            receiver=receiver,
            public_url=public_url,
            now=now,
        )
    if fmt == "slack":
        return slack_group(incidents, status=status, labels=group_labels, public_url=public_url)
    if fmt == "generic":
        return {
            "type": f"incidents.{status}",
            "timestamp": rfc3339(now),
            "data": {
                "group": dict(group_labels),
                "incidents": [
                    formats.incident_data(row, job, public_url) for row, job in incidents
                ],
            },
        }
    raise ValueError(f"unknown receiver format {fmt!r}")


def _line(row: Incident, job: str, public_url: str) -> str:
    ranks = formats.format_ranks(row.ranks)
    where = f"{job}" + (f", ranks {ranks}" if ranks else "")
    text = slack_escape(f"{row.kind} ({row.severity}) on {where}: {row.summary}")
    return f"• <{incident_url(public_url, row.id)}|#{row.id}> {text}"


def slack_group(
    incidents: list[Member], *, status: str, labels: dict[str, str], public_url: str
) -> dict[str, Any]:
    """One Slack message for several incidents: a title, a line each, a link to the list."""
    resolved = status == "resolved"
    icon = ":white_check_mark:" if resolved else ":rotating_light:"
    word = "Resolved" if resolved else "Firing"
    scope = ", ".join(f"{k} {v}" for k, v in labels.items()) or "all jobs"
    title = f"{word}: {len(incidents)} incidents ({scope})"
    lines = [_line(row, job, public_url) for row, job in incidents[:SLACK_LINES]]
    if len(incidents) > SLACK_LINES:
        lines.append(f"… and {len(incidents) - SLACK_LINES} more")
    return {
        "text": slack_escape(f"[Vigil] {title}")[: formats.SLACK_TEXT_LIMIT],
        "blocks": [
            formats._section(f"{icon} *{slack_escape(title)}*"),
            formats._section("\n".join(lines)),
            formats._section(f"<{public_url.rstrip('/')}/alerts|Open the alerts in Vigil>"),
        ],
    }
