"""Recovery policies: which one applies to an incident, and setting them.

    put_policy(session=session, job="*", kind="hang", mode="auto", actor="api:oncall")
    effective_policy(session=session, job="llama-8b-pretrain", kind="hang").mode  # "auto"

Rows are keyed by job name (or ``"*"``) and incident kind (or ``"*"``); the most specific
row wins as a whole: (job, kind) > (job, "*") > ("*", kind) > ("*", "*"). Without any row
the built-in default applies: mode ``approve`` with the cost model's defaults, so nothing
reaches a rank until a person agrees.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session

from backend.actions.models import ACTION_KINDS
from backend.audit.service import audit
from backend.db import insert_for, utcnow
from backend.errors import Invalid
from backend.incidents.models import INCIDENT_KINDS
from backend.jobs.models import Job
from backend.recovery.models import POLICY_MODES, RecoveryPolicy
from backend.recovery.schemas import PolicyParams

ANY = "*"
DEFAULT_MODE = "approve"


class PolicyError(Invalid):
    """A policy that cannot be stored; the message names the bad field."""


@dataclass(frozen=True)
class EffectivePolicy:
    job: str
    kind: str
    mode: str
    actions: tuple[str, ...] | None = None
    params: dict[str, Any] = field(default_factory=dict)
    source: str = "built-in"  # "<job>/<kind>" of the row that matched

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "actions": list(self.actions) if self.actions is not None else None,
            "params": dict(self.params),
            "source": self.source,
        }


def effective_policy(*, session: Session, job: str, kind: str) -> EffectivePolicy:
    """The policy for incidents of ``kind`` in ``job``: the most specific row, else built-in."""
    rows = session.scalars(
        select(RecoveryPolicy).where(
            RecoveryPolicy.job.in_([job, ANY]), RecoveryPolicy.kind.in_([kind, ANY])
        )
    ).all()
    order = [(job, kind), (job, ANY), (ANY, kind), (ANY, ANY)]
    by_key = {(r.job, r.kind): r for r in rows}
    for key in order:
        row = by_key.get(key)
        if row is not None:
            return EffectivePolicy(
                job=job,
                kind=kind,
                mode=row.mode,
                actions=tuple(row.actions) if row.actions is not None else None,
                params=dict(row.params or {}),
                source=f"{row.job}/{row.kind}",
            )
    return EffectivePolicy(job=job, kind=kind, mode=DEFAULT_MODE)


def list_policies(*, session: Session, job: str) -> list[RecoveryPolicy]:
    """Rows stored for ``job`` (``"*"``: the defaults for every job), by kind."""
    query = select(RecoveryPolicy).where(RecoveryPolicy.job == job).order_by(RecoveryPolicy.kind)
    return list(session.scalars(query))


def validate_policy(
    *, job: str, kind: str, mode: str, actions: list[str] | None, params: dict[str, Any] | None
) -> dict[str, Any]:
    """Check a policy; returns its params with unset values dropped. Raises PolicyError."""
    if not job or len(job) > 200:
        raise PolicyError("job: a job name of 1 to 200 characters, or '*'")
    if kind != ANY and kind not in INCIDENT_KINDS:
        raise PolicyError(
            f"kind: unknown incident kind {kind!r}; use one of {', '.join(INCIDENT_KINDS)} or '*'"
        )
    if mode not in POLICY_MODES:
        raise PolicyError(f"mode: {mode!r} is not one of {', '.join(POLICY_MODES)}")
    for action in actions or ():
        if action not in ACTION_KINDS:
            raise PolicyError(
                f"actions: unknown action kind {action!r}; use one of {', '.join(ACTION_KINDS)}"
            )
    try:
        checked = PolicyParams.model_validate(params or {})
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise PolicyError(f"params.{where}: {first['msg']}") from exc
    return checked.model_dump(exclude_none=True)


def put_policy(
    *,
    session: Session,
    job: str,
    kind: str,
    mode: str,
    actor: str,
    actions: list[str] | None = None,
    params: dict[str, Any] | None = None,
) -> tuple[RecoveryPolicy, bool]:
    """Create or replace the policy for (job, kind); audited. Returns ``(row, created)``.

    The job need not exist yet: policies can be set before a job first reports.
    """
    clean = validate_policy(job=job, kind=kind, mode=mode, actions=actions, params=params)
    now = utcnow()
    values = {
        "mode": mode,
        "actions": list(dict.fromkeys(actions)) if actions is not None else None,
        "params": clean,
        "updated_by": actor[:128],
        "updated_at": now,
    }
    # Insert-if-absent, then lock and update: two concurrent PUTs cannot both insert.
    table = RecoveryPolicy.__table__
    inserted = session.scalar(
        insert_for(session, table)
        .values(job=job, kind=kind, **values)
        .on_conflict_do_nothing(index_elements=["job", "kind"])
        .returning(table.c.id)
    )
    created = inserted is not None
    row = session.scalars(
        select(RecoveryPolicy)
        .where(RecoveryPolicy.job == job, RecoveryPolicy.kind == kind)
        .with_for_update()
        .execution_options(populate_existing=True)
    ).one()
    previous = None if created else {"mode": row.mode, "actions": row.actions, "params": row.params}
    for key, value in values.items():
        setattr(row, key, value)
    session.flush()
    job_id = None if job == ANY else session.scalar(select(Job.id).where(Job.name == job))
    audit(
        session=session,
        job_id=job_id,
        actor=actor,
        event="policy_set",
        detail={
            "job": job,
            "kind": kind,
            "mode": mode,
            "actions": values["actions"],
            "params": clean,
            "previous": previous,
        },
    )
    return row, created
