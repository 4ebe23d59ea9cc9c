"""Request and response shapes of the recovery API: policies and approvals.

PUT /api/v1/jobs/llama-8b-pretrain/policies/straggler
{"mode": "auto", "actions": ["evict_rank", "restart"],
 "params": {"horizon_s": 36000, "allow_evict": true, "cooldown_s": 600}}
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from backend.actions.models import ACTION_KINDS


def _known_action(kind: str) -> str:
    if kind not in ACTION_KINDS:
        raise ValueError(f"unknown action kind {kind!r}; use one of {', '.join(ACTION_KINDS)}")
    return kind


ActionKind = Annotated[str, AfterValidator(_known_action)]
Mode = Literal["auto", "approve", "off"]


class PolicyParams(BaseModel):
    """Cost-model inputs and guards. Unset values take the built-in defaults."""

    model_config = ConfigDict(extra="forbid", strict=True)

    horizon_s: Annotated[float, Field(gt=0, le=10 * 365 * 86_400)] | None = Field(
        default=None, description="Training time left that a slowdown would affect (default 4 h)."
    )
    restart_s: Annotated[float, Field(ge=0, le=86_400)] | None = Field(
        default=None, description="Seconds a restart of the group takes (default 120)."
    )
    checkpoint_s: Annotated[float, Field(ge=0, le=86_400)] | None = Field(
        default=None, description="Seconds a checkpoint stalls training (default 30)."
    )
    allow_evict: bool | None = Field(
        default=None, description="May the policy evict ranks (default no)."
    )
    persist_p: Annotated[float, Field(ge=0, le=1)] | None = Field(
        default=None, description="Chance a straggler stays slow after a restart (default 0.5)."
    )
    respond_s: Annotated[float, Field(ge=0, le=7 * 86_400)] | None = Field(
        default=None,
        description="Until a person notices a down or diverged job and acts (default 1800).",
    )
    min_gain_s: Annotated[float, Field(ge=0)] | None = Field(
        default=None,
        description="A restart, eviction or rollback must save this much (default 300).",
    )
    cooldown_s: Annotated[float, Field(ge=0)] | None = Field(
        default=None, description="No automatic disruptive action this soon after another."
    )
    max_restarts_per_hour: Annotated[int, Field(ge=0)] | None = Field(
        default=None, description="Cap on restarts, evictions and rollbacks per job per hour."
    )
    ttl_s: Annotated[float, Field(gt=0, le=86_400)] | None = Field(
        default=None, description="An approved or automatic action undelivered this long expires."
    )
    approve_ttl_s: Annotated[float, Field(gt=0, le=7 * 86_400)] | None = Field(
        default=None, description="A proposal not approved this long expires (default 1 h)."
    )


class PolicyIn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    mode: Mode = Field(description="auto: act; approve: propose and wait; off: do nothing.")
    actions: list[ActionKind] | None = Field(
        default=None, description="Candidate actions for this kind; null means the built-in ones."
    )
    params: PolicyParams = Field(default_factory=lambda: PolicyParams())


class PolicyOut(BaseModel):
    job: str
    kind: str
    mode: str
    actions: list[str] | None
    params: dict[str, Any]
    updated_by: str
    updated_at: datetime


class DecisionIn(BaseModel):
    """Body of approve and cancel (optional)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    force: bool = Field(
        default=False, description="Approve even if a guard (cooldown, cap) blocks."
    )
    note: Annotated[str, Field(max_length=2000)] = ""
