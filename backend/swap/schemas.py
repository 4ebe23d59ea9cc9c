"""Response shape of ``GET /api/v1/jobs/{job}/swap`` (``backend.swap.report``)."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field


class FingerprintOut(BaseModel):
    shape_fp: str
    first_step: int
    opseq: str | None = Field(description="op-sequence fingerprint; null until a step is captured")
    change: Literal["first", "structure", "shapes", "same", "unknown"] = Field(
        description="how its op sequence differs from the previous fingerprint's: other ops "
        "(structure), the same ops on other shapes (shapes), the same sequence (same); "
        "unknown while either sequence is not captured"
    )


class PolicyOut(BaseModel):
    version: int
    opseq: str
    state: Literal["proposed", "applied", "superseded", "failed"]
    reason: str
    budget_bytes: int
    predicted_peak_bytes: int
    measured_peak_bytes: int | None
    predicted_exposed_s: float
    feasible: bool
    applied_step: int | None
    created_at: datetime


class JobSwapOut(BaseModel):
    fingerprints: list[FingerprintOut]
    policies: list[PolicyOut]
    active: int | None = Field(description="version the job's latest steps run; null: none")
