"""Holds: an incident resolved by hand stays resolved for the rest of its episode.

Detection keys an incident by its finding's key (fingerprint ``<job id>:<key>``, e.g.
``7:straggler:6``): without a hold, the next detection run would see the same condition
and re-open the incident a person just resolved. The rule, applied by
``backend.incidents.service.apply_findings``:

- an active finding with the held incident's key whose episode began at or before the last
  step that incident knew (``first_step`` … evidence ``last_step``) is the same episode:
  ignored, the incident stays resolved; a finding without steps (or an incident without)
  counts as the same episode;
- a finding whose episode began after that is a new condition: a new incident opens (and
  the old hold ends);
- once a detection run that covers the kind no longer reports the key as active (the
  condition cleared), the hold ends, and any later finding opens a new incident.

    holds = Holds(session, job_id)
    for f in findings:
        if no_open_incident and holds.covers(fp, f):
            continue
    holds.release(covered_kinds)
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import select
from sqlalchemy.orm import Session

from backend.incidents.models import Incident
from detectors.finding import Finding


class Holds:
    """The job's incidents resolved by hand whose episode the detector may still report.

    ``apply_findings`` asks ``covers(fp, finding)`` for an active finding with no open
    incident (True: the same episode, ignore it), then ``release(covered)`` at the end.
    """

    def __init__(self, session: Session, job_id: int) -> None:
        rows = session.scalars(
            select(Incident)
            .where(Incident.job_id == job_id, Incident.status == "resolved", Incident.held)
            .order_by(Incident.id)
        )
        self.rows = {row.fingerprint: row for row in rows}
        self.live: set[str] = set()

    def covers(self, fp: str, finding: Finding) -> bool:
        """Whether the active finding continues a held incident's episode."""
        row = self.rows.get(fp)
        if row is None or not finding.active:
            return False
        if same_episode(row, finding):
            self.live.add(fp)
            return True
        row.held = False  # a new episode: the hold on the old one is over
        return False

    def release(self, covered: Iterable[str]) -> None:
        """End the holds of covered kinds whose key no active finding reported."""
        kinds = set(covered)
        for fp, row in self.rows.items():
            if row.held and row.kind in kinds and fp not in self.live:
                row.held = False


def same_episode(row: Incident, finding: Finding) -> bool:
    """Whether ``finding`` began at or before the last step ``row`` knew (or either has
    no steps: then only the condition clearing ends the episode)."""
    if finding.first_step is None or row.first_step is None:
        return True
    known_to = max(row.first_step, int((row.evidence or {}).get("last_step", row.first_step)))
    return finding.first_step <= known_to
