"""Guards that keep the recovery policy from putting a job in a restart loop.

    results = check_guards(session=session, job_id=7, kind="restart", params={},
                           settings=settings, now=utcnow())
    blocked = [g for g in results if not g.ok]

Both guards apply to *disruptive* actions only (restart, exit_for_restart, evict_rank,
rollback); dump_stacks and checkpoint_now neither are blocked nor start a cooldown.

- **cooldown**: no automatic disruptive action within ``cooldown_s`` (policy params, else
  ``settings.restart_cooldown_s``) of another *policy-made* disruptive action on the job.
- **hourly cap**: at most ``max_restarts_per_hour`` (params, else settings) disruptive
  actions per job in the last hour, whoever asked for them (a person's restarts count).

An action counts from when it was released to ranks (created ``pending``, or approved) and
unless it was cancelled or expired before running; proposals waiting for approval do not
count (the guards are checked again when one is approved).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from backend.actions.models import Action
from backend.audit.models import AuditEntry
from backend.settings import Settings
from detectors.policy import DISRUPTIVE, human_seconds

RELEASED_STATES = ("pending", "dispatched", "acked", "succeeded", "failed")
HOUR_S = 3600.0


@dataclass(frozen=True)
class GuardResult:
    guard: str
    ok: bool
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return {"guard": self.guard, "ok": self.ok, "detail": self.detail}


def guard_limits(params: Mapping[str, Any], settings: Settings | None) -> tuple[float, int]:
    """``(cooldown_s, max_restarts_per_hour)``: policy params, else settings, else defaults."""
    fields = Settings.model_fields
    cooldown = params.get("cooldown_s")
    if cooldown is None:
        cooldown = settings.restart_cooldown_s if settings else fields["restart_cooldown_s"].default
    cap = params.get("max_restarts_per_hour")
    if cap is None:
        cap = (
            settings.max_restarts_per_hour if settings else fields["max_restarts_per_hour"].default
        )
    return float(cooldown), int(cap)


def released_actions(
    *, session: Session, job_id: int, since: datetime, exclude_action_id: int | None = None
) -> list[tuple[Action, datetime]]:
    """Disruptive actions of the job released to ranks at or after ``since``, with when."""
    query = select(Action).where(
        Action.job_id == job_id,
        Action.kind.in_(sorted(DISRUPTIVE)),
        Action.state.in_(RELEASED_STATES),
        Action.updated_at >= since,  # release touches updated_at: a cheap pre-filter
    )
    if exclude_action_id is not None:
        query = query.where(Action.id != exclude_action_id)
    actions = list(session.scalars(query))
    approved_ids = [a.id for a in actions if a.approved_by is not None]
    approved_at: dict[int, datetime] = {}
    if approved_ids:
        rows = session.execute(
            select(AuditEntry.action_id, func.max(AuditEntry.at))
            .where(AuditEntry.action_id.in_(approved_ids), AuditEntry.event == "approved")
            .group_by(AuditEntry.action_id)
        )
        approved_at = {int(aid): at for aid, at in rows if aid is not None}
    out = []
    for action in actions:
        at = approved_at.get(action.id, action.created_at)
        if at >= since:
            out.append((action, at))
    return sorted(out, key=lambda pair: pair[1])


def check_guards(
    *,
    session: Session,
    job_id: int,
    kind: str,
    params: Mapping[str, Any],
    settings: Settings | None,
    now: datetime,
    exclude_action_id: int | None = None,
) -> list[GuardResult]:
    """Every guard with whether it lets an action of ``kind`` through now, and why."""
    if kind not in DISRUPTIVE:
        return [GuardResult("disruptive", True, f"{kind} is not disruptive: no guard applies")]
    cooldown_s, cap = guard_limits(params, settings)
    window = max(cooldown_s, HOUR_S)
    released = released_actions(
        session=session,
        job_id=job_id,
        since=now - timedelta(seconds=window),
        exclude_action_id=exclude_action_id,
    )
    results = []
    recent = [
        (a, at)
        for a, at in released
        if cooldown_s > 0
        and a.requested_by == "policy"
        and at > now - timedelta(seconds=cooldown_s)
    ]
    if recent:
        last, at = recent[-1]
        ago = (now - at).total_seconds()
        results.append(
            GuardResult(
                "cooldown",
                False,
                f"action {last.id} ({last.kind}) was released {human_seconds(ago)} ago; "
                f"cooldown is {human_seconds(cooldown_s)}",
            )
        )
    else:
        results.append(
            GuardResult(
                "cooldown", True, f"no policy action in the last {human_seconds(cooldown_s)}"
            )
        )
    hour = [a for a, at in released if at >= now - timedelta(seconds=HOUR_S)]
    results.append(
        GuardResult(
            "hourly_cap",
            len(hour) < cap,
            f"{len(hour)} restart/evict/rollback action(s) in the last hour; the cap is {cap}",
        )
    )
    return results
