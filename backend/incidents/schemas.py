"""Incident as DESIGN.md's REST contract shows it, plus score and update time, and how
people handled it (acknowledged, resolved by hand, silenced, open for how long)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from backend.jobs.schemas import Reading


class IncidentOut(BaseModel):
    model_config = ConfigDict(ser_json_inf_nan="strings")

    id: int
    job: str
    kind: str
    severity: str
    status: str
    ranks: list[int]
    first_step: int | None
    detected_at: datetime
    updated_at: datetime
    resolved_at: datetime | None
    summary: str
    evidence: dict[str, Any]
    score: Reading
    acked_at: datetime | None = None
    acked_by: str | None = Field(None, description="Who acknowledged it (api:/ui:<token>).")
    resolved_by: str | None = Field(None, description="Who resolved it by hand; null: detection.")
    resolution_note: str | None = None
    silenced_by: list[int] = Field(
        default_factory=list, description="Ids of the active silences that mute it."
    )
    open_for_s: float = Field(0.0, description="Detection to resolution, or to now if open.")
    run: int = Field(1, description="The run of the job it was opened in (its number).")


class AckIn(BaseModel):
    """Body of acknowledge (optional)."""

    model_config = ConfigDict(extra="forbid")

    note: str = Field("", max_length=2000, description="What is being done (audited).")


class ResolveIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    note: str = Field(min_length=1, max_length=2000, description="Why it is resolved.")
