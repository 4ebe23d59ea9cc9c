"""Send a swap policy to a job's ranks: an ``apply_swap_policy`` action, as the recovery
policy allows.

    push(session=session, job=job, row=policy_row, shape_fp="…", incident=incident,
         kind="opseq_change", ranks=live_swap_ranks(...), settings=settings, now=utcnow())

An action goes through the recovery policy of its incident's kind (``over_budget``: the
kind of the incident behind the policy it replaces): ``off``, or an ``actions`` list
without ``apply_swap_policy``, sends nothing; ``approve`` creates it ``proposed``; ``auto``
and — unlike other actions — the **built-in default** (no policy row matches) create it
``pending``: a policy changes no result of training and is cheap to apply, so drift is
acted on at once unless a person chose otherwise. The guards are checked (the action is not
disruptive, so none blocks it) and recorded in its reasoning; creating it is audited.

Idempotency key ``swap:<job id>:v<version>:<cause>`` (cause ``incident:<id>`` or
``over_budget``): one action per policy version and cause; ``sent`` tells whether a version
is on its way to, or was applied by, the job's current restart attempt.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from backend.actions.models import Action
from backend.actions.service import DEFAULT_TTL_S, create_action
from backend.audit.service import audit
from backend.incidents.models import Incident
from backend.jobs.models import Job, Rank
from backend.recovery.guards import check_guards
from backend.recovery.policies import EffectivePolicy, effective_policy
from backend.settings import Settings
from backend.swap.models import SwapPolicy
from backend.swap.report import describe
from detectors.policy import DEFAULT_CANDIDATES

__all__ = ["ACTION", "push", "sent"]

ACTION = "apply_swap_policy"
ACTOR = "policy"
DEFAULT_APPROVE_TTL_S = 3600.0


def push(
    *,
    session: Session,
    job: Job,
    row: SwapPolicy,
    shape_fp: str,
    incident: Incident | None,
    kind: str,
    ranks: list[Rank],
    settings: Settings | None,
    now: datetime,
    cause: str | None = None,
) -> Action | None:
    """Send ``row`` to the live swap-capable ``ranks`` as an ``apply_swap_policy`` action,
    as the recovery policy for ``kind`` allows (module doc). None when it does not, or when
    the action exists already: one per policy version and ``cause`` (default: the incident).
    """
    cause = cause or f"incident:{incident.id if incident is not None else 0}"
    key = f"{_key_prefix(job, row.version)}{cause}"
    if session.scalar(select(Action.id).where(Action.idempotency_key == key)) is not None:
        return None
    rp = effective_policy(session=session, job=job.name, kind=kind)
    mode = "auto" if rp.source == "built-in" else rp.mode
    allowed = rp.actions if rp.actions is not None else DEFAULT_CANDIDATES.get(kind, ())
    if mode == "off" or ACTION not in allowed:
        return None  # the user's policy (recorded when set) says no; nothing to audit
    guards = check_guards(
        session=session, job_id=job.id, kind=ACTION, params=rp.params, settings=settings, now=now
    )
    explanation = describe(row, shape_fp)
    reasoning: dict[str, object] = {
        "chosen": ACTION,
        "explanation": explanation,
        "policy": {**rp.to_dict(), "mode": mode},
        "guards": [g.to_dict() for g in guards],
        "swap": _swap_facts(row, shape_fp, ranks),
        "incident": _incident_facts(incident),
    }
    blocked = [g for g in guards if not g.ok]
    if blocked:
        _note_blocked(session, job, incident, blocked[0].guard, blocked[0].detail, reasoning, now)
        return None
    action, created = create_action(
        session=session,
        job_id=job.id,
        kind=ACTION,
        requested_by=ACTOR,
        target_ranks=[r.rank for r in ranks],
        params={"policy": row.policy, "shape_fp": shape_fp},
        reason=explanation[:2000],
        idempotency_key=key,
        ttl_s=_ttl(rp, mode),
        incident_id=incident.id if incident is not None else None,
        state="pending" if mode == "auto" else "proposed",
        reasoning=reasoning,
    )
    if row.action_id is None:
        row.action_id = action.id
    session.flush()
    return action if created else None


def _key_prefix(job: Job, version: int) -> str:
    return f"swap:{job.id}:v{version}:"


def sent(session: Session, job: Job, version: int) -> bool:
    """Whether an action carrying policy ``version`` is open or done in the job's current
    attempt (a restarted job's processes have not received it)."""
    found = session.scalar(
        select(Action.id)
        .where(
            Action.job_id == job.id,
            Action.idempotency_key.startswith(_key_prefix(job, version), autoescape=True),
            Action.attempt == job.attempt,
            Action.state.not_in(("failed", "cancelled", "expired")),
        )
        .limit(1)
    )
    return found is not None


def _ttl(rp: EffectivePolicy, mode: str) -> float:
    if mode == "auto":
        return float(rp.params.get("ttl_s", DEFAULT_TTL_S))
    return float(rp.params.get("approve_ttl_s", DEFAULT_APPROVE_TTL_S))


def _swap_facts(row: SwapPolicy, shape_fp: str, ranks: list[Rank]) -> dict[str, object]:
    return {
        "version": row.version,
        "opseq": row.opseq,
        "shape_fp": shape_fp,
        "reason": row.reason,
        "budget_bytes": row.budget_bytes,
        "margin": row.margin,
        "bandwidth_bytes_per_s": row.bandwidth_bytes_per_s,
        "predicted_peak_bytes": row.predicted_peak_bytes,
        "predicted_exposed_s": row.predicted_exposed_s,
        "feasible": row.feasible,
        "offloaded": len(row.policy.get("offload", [])),
        "capacity_bytes": {str(r.rank): r.mem_capacity for r in ranks},
    }


def _incident_facts(incident: Incident | None) -> dict[str, object] | None:
    if incident is None:
        return None
    return {"id": incident.id, "kind": incident.kind, "summary": incident.summary}


def _note_blocked(
    session: Session,
    job: Job,
    incident: Incident | None,
    guard: str,
    message: str,
    reasoning: dict[str, object],
    now: datetime,
) -> None:
    audit(
        session=session,
        job_id=job.id,
        actor=ACTOR,
        event="blocked",
        incident_id=incident.id if incident is not None else None,
        detail={"action": ACTION, "guard": guard, "message": message, "reasoning": reasoning},
        at=now,
    )
