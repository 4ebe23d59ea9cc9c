"""What the incident and alerts pages show of alert handling: how long an incident has
been open, who acknowledged it, the silences that mute it, the silence form's choices.
The form posts that change these are ``backend.ui.handling_forms``.

    context.update(incident_handling(session, row, job_name))     # the incident page
    context = alerts_context(session, opened, resolved)            # the alerts page
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from backend.alerts import service as alerts
from backend.alerts import silences
from backend.alerts.models import Silence
from backend.db import utcnow
from backend.incidents import handling
from backend.incidents.models import INCIDENT_KINDS, SEVERITIES, Incident

# The silence form's choices of how long: (seconds, label).
DURATIONS = (
    (1800, "30 min"),
    (3600, "1 h"),
    (2 * 3600, "2 h"),
    (4 * 3600, "4 h"),
    (8 * 3600, "8 h"),
    (86400, "1 day"),
    (3 * 86400, "3 days"),
    (7 * 86400, "7 days"),
)


def incident_handling(session: Session, incident: Incident, job: str) -> dict[str, Any]:
    """The incident page's handling panel: open for how long, who acknowledged it, the
    silences that mute it, and the choices of the silence form."""
    now = utcnow()
    active = silences.active_silences(session=session, now=now)
    muting = silences.silencing(active, incident, job) if incident.status == "open" else []
    return {
        "handling": {
            "open_for": handling.duration_text(handling.open_for_s(incident, now)),
            "silenced_by": muting,
            "durations": DURATIONS,
            "kinds": INCIDENT_KINDS,
            "severities": SEVERITIES,
        }
    }


def alerts_context(session: Session, opened: list[Any], resolved: list[Any]) -> dict[str, Any]:
    """The alerts page: ``opened``/``resolved`` are ``(Incident, job name)`` rows. Each
    open one gets how long it has been open and the silences that mute it; the page also
    lists the silences not yet expired, and the receivers (for "send open incidents")."""
    now = utcnow()
    active = silences.active_silences(session=session, now=now)
    rows = [
        {
            "incident": row,
            "job": job,
            "open_for": handling.duration_text(handling.open_for_s(row, now)),
            "silenced_by": [s.id for s in silences.silencing(active, row, job)],
        }
        for row, job in opened
    ]
    current = session.scalars(
        select(Silence).where(Silence.ends_at > now).order_by(Silence.ends_at)
    ).all()
    return {
        "open_rows": rows,
        "resolved": [i for i, _ in resolved],
        "resolved_jobs": [name for _, name in resolved],
        "silences": [(s, s.state(now)) for s in current],
        "receivers": alerts.list_receivers(session=session),
        "durations": DURATIONS,
        "kinds": INCIDENT_KINDS,
        "severities": SEVERITIES,
    }
