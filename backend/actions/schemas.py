"""Request and response shapes of the actions API."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from backend.deps import MAX_ROW_ID

KIND_PATTERN = r"^[a-z][a-z0-9_]{0,31}$"


class ActionCreate(BaseModel):
    model_config = ConfigDict(strict=True)  # `true` is no rank, "5" no number

    kind: Annotated[str, Field(pattern=KIND_PATTERN, examples=["dump_stacks", "restart"])]
    target_ranks: list[Annotated[int, Field(ge=0)]] | None = Field(
        None, description="Ranks that should run it; null means every rank of the job."
    )
    params: dict[str, Any] = Field(default_factory=dict)
    reason: Annotated[str, Field(max_length=2000)] = ""
    idempotency_key: Annotated[str, Field(min_length=1, max_length=128)] | None = Field(
        None, description="Repeating a request with the same key returns the first action."
    )
    ttl_s: Annotated[float, Field(gt=0, le=86_400)] = Field(
        600, description="Undelivered after this long, the action expires."
    )
    incident_id: Annotated[int, Field(ge=1, le=MAX_ROW_ID)] | None = Field(
        None, description="The job's incident the action answers (shown with it, audited)."
    )


class ActionOut(BaseModel):
    id: int
    job: str
    kind: str
    state: str
    requested_by: str
    target_ranks: list[int] | None
    params: dict[str, Any]
    reason: str
    attempt: int = Field(0, description="The job's restart attempt the action is for.")
    idempotency_key: str
    deliveries: dict[str, Any]
    result: dict[str, Any] | None
    incident_id: int | None
    reasoning: dict[str, Any] | None = Field(
        None, description="The recovery policy's cost table and the guards it checked."
    )
    approved_by: str | None = None
    created_at: datetime
    updated_at: datetime
    expires_at: datetime | None
