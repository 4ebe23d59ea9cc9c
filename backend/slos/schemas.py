"""Request and response shapes of the SLO API."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic.json_schema import SkipJsonSchema

Threshold = Annotated[float, Field(gt=0, le=86_400, allow_inf_nan=False)] | None
Objective = Annotated[float, Field(gt=0, lt=1, examples=[0.99])]
Period = Annotated[float, Field(ge=3600, le=366 * 86_400, examples=[28 * 86_400])]
Name = Annotated[str, Field(min_length=1, max_length=128, examples=["interactive"])]


class SloIn(BaseModel):
    """``job`` and ``name`` identify the SLO; at least one threshold (seconds) is set."""

    model_config = ConfigDict(extra="forbid", strict=True)

    job: Annotated[str, Field(min_length=1, max_length=200, examples=["chat-prod"])]
    name: Name
    model: Annotated[str, Field(min_length=1, max_length=128)] | None = None
    ttft_s: Threshold = Field(None, examples=[0.5])
    tpot_s: Threshold = Field(None, examples=[0.05])
    max_tbt_s: Threshold = None
    e2e_s: Threshold = None
    objective: Objective = 0.99
    period_s: Period = 28 * 86_400.0


class SloPatch(BaseModel):
    """Any of the SLO's fields; ``null`` clears a threshold."""

    model_config = ConfigDict(extra="forbid", strict=True)

    # Unset: unchanged. These three may not be null (the SLO always has them).
    name: Name | SkipJsonSchema[None] = None
    model: Annotated[str, Field(min_length=1, max_length=128)] | None = None
    ttft_s: Threshold = None
    tpot_s: Threshold = None
    max_tbt_s: Threshold = None
    e2e_s: Threshold = None
    objective: Objective | SkipJsonSchema[None] = None
    period_s: Period | SkipJsonSchema[None] = None

    @field_validator("name", "objective", "period_s")
    @classmethod
    def _not_null(cls, value: object) -> object:
        if value is None:  # sent as null: only the thresholds and model can be cleared
            raise ValueError("may not be null")
        return value


class SloOut(BaseModel):
    id: int
    job: str
    name: str
    model: str | None
    ttft_s: float | None
    tpot_s: float | None
    max_tbt_s: float | None
    e2e_s: float | None
    objective: float
    period_s: float
    created_at: datetime
    updated_at: datetime


class BurnRate(BaseModel):
    """One alert tier's windows ending now (``detectors.burn_rate``): it fires when both
    burn faster than ``factor`` (a burn rate over an empty window is null)."""

    tier: str  # "page-fast", "page-slow" or "ticket"
    severity: str
    long_window_s: float
    short_window_s: float
    factor: float
    long_burn_rate: float | None
    short_burn_rate: float | None
    long_total: float
    long_bad: float
    short_total: float
    short_bad: float
    firing: bool


class SloStatus(SloOut):
    """The SLO with its figures over ``since..until`` (default: its period up to now)."""

    requests: int
    attainment: float | None
    attainment_by_threshold: dict[str, float | None]
    goodput_rps: float
    goodput_tokens_per_s: float
    smooth_goodput: float
    error_budget_remaining: float | None
    burn_rates: list[BurnRate]
    since: float
    until: float
