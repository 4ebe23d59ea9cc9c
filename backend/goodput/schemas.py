"""Response shape of ``GET /api/v1/jobs/{job}/goodput``."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field


class Badput(BaseModel):
    """Seconds lost, by cause (definitions: ``detectors/goodput.py``)."""

    wasted_progress: float = Field(description="steps redone after a restart rolled back")
    disruption_recovery: float = Field(
        description="from an attempt's last step to the next attempt's first, within a run"
    )
    between_runs: float = Field(
        description="from a run's last step to the next run's first: the job was down "
        "between two launches of its name"
    )
    hang: float = Field(description="from the last progress to the hang's end")
    straggler_slowdown: float = Field(description="step time beyond the pre-incident median")
    data_loading: float = Field(description="input waits (data_s) of surviving steps")
    checkpointing: float = Field(description="checkpoint saves")
    other: float = Field(description="the remainder, so that everything sums to total_s")


class GoodputOut(BaseModel):
    job: str
    run: int | None = Field(None, description="the run accounted alone (`?run=`); null: all")
    total_s: float = Field(description="from the first step's start to as_of")
    productive_s: float
    goodput: float | None = Field(description="productive_s / total_s; null without steps")
    badput: Badput
    restarts: int
    steps_lost: int
    as_of: datetime = Field(description="end of the accounting window")
