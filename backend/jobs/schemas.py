"""Response shapes of the jobs read API."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema

# A reading where NaN/Inf is the signal (loss, grad norm, a detector's score). JSON has no
# NaN, so models with ``ser_json_inf_nan="strings"`` send "NaN", "Infinity" or
# "-Infinity"; the OpenAPI schema says so (the UI's charts read them as gaps).
Reading = Annotated[
    float | None,
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "number"},
                {"type": "string", "enum": ["NaN", "Infinity", "-Infinity"]},
                {"type": "null"},
            ]
        },
        mode="serialization",
    ),
]


class RunOut(BaseModel):
    """One launch of the job (``backend.jobs.runs``)."""

    number: int = Field(description="1, 2, … within the job")
    key: str = Field(description="vigil run's or torchrun's run id, or one the server made")
    kind: str
    state: str = Field(description="running, finished, failed or lost")
    started_at: datetime
    ended_at: datetime | None
    reason: str = Field(description="Why it ended, for people")


class JobOut(BaseModel):
    name: str
    kind: str
    world_size: int
    attempt: int = Field(description="The current run's restart attempt (torchrun's count)")
    created_at: datetime
    last_seen_at: datetime | None
    last_step: int | None
    ranks_reporting: int = Field(
        description="Ranks of the current run that report now: no goodbye, seen in the last 15 s"
    )
    state: str | None = Field(
        None, description="The current run's state: running, finished, failed or lost"
    )
    run: RunOut | None = None


class JobDetail(JobOut):
    steps_stored: int
    step_time_median_s: float | None
    open_incidents: int
    runs: list[RunOut] = Field(default_factory=list, description="Newest first")


class StepOut(BaseModel):
    # NaN/Inf loss is the signal a numerics detector needs; JSON has no NaN, so
    # non-finite values are written as the strings "NaN", "Infinity", "-Infinity".
    model_config = ConfigDict(ser_json_inf_nan="strings")

    step: int
    rank: int
    run: int | None = Field(None, description="The run's number")
    attempt: int = Field(description="The restart attempt within the run")
    ts: float
    duration_s: float
    comm_s: float | None
    data_s: float | None
    loss: Reading
    grad_norm: Reading
    mem_bytes: int | None
    tokens: int | None
    opseq: str | None


class StepPage(BaseModel):
    model_config = ConfigDict(ser_json_inf_nan="strings")

    items: list[StepOut]
    next_cursor: str | None


class RankOut(BaseModel):
    rank: int
    host: str | None
    run: int | None = Field(None, description="The number of the run it last reported for")
    attempt: int = Field(description="The restart attempt within that run")
    last_step: int | None
    current_step: int | None
    last_step_ts: float | None
    last_heartbeat_ts: float | None
    heartbeat_age_s: float | None
    inflight: dict[str, Any] | None
    pid: int | None
    exited: bool
    exit_code: int | None = Field(None, description="What its goodbye said, when it said")
    drops: dict[str, int] | None
    last_seen_at: datetime
