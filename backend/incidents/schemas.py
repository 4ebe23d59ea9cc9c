"""Incident as DESIGN.md's REST contract shows it, plus score and update time."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict

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
