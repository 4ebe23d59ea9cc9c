"""Response shapes of the chart routes (``backend.telemetry.views``), so ``/openapi.json``
documents them. The queries (``backend.telemetry.queries``) build plain dicts; the routes
answer with ``response_model_exclude_unset``, so a key a query leaves out (``rollup`` of
a chart read from raw rows, the bin sizes of an empty chart) stays out of the JSON.

Numbers are rounded and never NaN or infinite: a missing or non-finite value is ``null``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, Field, PlainSerializer, WithJsonSchema

from backend.goodput.schemas import GoodputOut
from backend.jobs.schemas import JobDetail

# A datetime written as Python's ``isoformat()`` ("…+00:00"), as the dashboard always did.
IsoDateTime = Annotated[
    datetime,
    PlainSerializer(lambda value: value.isoformat(), return_type=str),
    WithJsonSchema({"type": "string", "format": "date-time"}),
]


class StepBinning(BaseModel):
    """How the chart's steps were binned (``backend.telemetry.binning``)."""

    step_bin: int | None = Field(
        None, description="steps per bin; absent where the job has no steps (heatmap: 1)"
    )
    sampled_steps_per_bin: int | None = Field(
        None, description="steps read per bin where a big job is sampled; null: every step"
    )
    rollup: int | None = Field(
        None, description="bin width of the rollup level read; absent when read from raw rows"
    )


class Heatmap(StepBinning):
    x: list[int] = Field(description="first step of each step bin")
    y: list[int] = Field(description="first rank of each rank bin")
    z: list[list[float | None]] = Field(
        description="compute time (s), z[rank bin][step bin]; null where nothing was reported"
    )
    rank_bin: int = Field(description="ranks per bin")
    ranks: int | None = Field(None, description="highest rank + 1")
    agg: Literal["avg", "max"] | None = Field(None, description="aggregate over each cell")
    value: Literal["compute_s"] = Field(description="what z holds: step − collective wait")


class IncidentMark(BaseModel):
    """An incident, as the charts mark it at its first step."""

    id: int
    kind: str
    severity: str
    status: str
    ranks: list[int]
    first_step: int | None
    summary: str
    detected_at: IsoDateTime


class MemorySeries(StepBinning):
    step: list[int] = Field(description="first step of each bin with memory reported")
    max_bytes: list[int] = Field(description="peak mem_bytes over all ranks")


class Series(StepBinning):
    step: list[int] = Field(description="first step of each bin")
    step_time: list[float | None] = Field(description="mean step time (s) of the lowest rank")
    step_time_max: list[float | None]
    loss: list[float | None] = Field(description="mean finite loss of the lowest rank")
    nonfinite_loss_steps: list[int] = Field(description="first step of bins with NaN/Inf loss")
    memory: MemorySeries
    incidents: list[IncidentMark]
    rank: int | None = Field(None, description="the rank drawn: the lowest reporting one")


class GroupBandwidth(BaseModel):
    group: str
    step: list[int]
    bytes_per_s: list[float | None] = Field(description="collective bytes ÷ seconds")


class Bandwidth(StepBinning):
    groups: list[GroupBandwidth]


class OverviewJob(JobDetail):
    created_at: IsoDateTime
    last_seen_at: IsoDateTime | None


class OverviewGoodput(GoodputOut):
    steps_productive: int
    as_of: IsoDateTime = Field(description="end of the accounting window")


class JobOverview(BaseModel):
    job: OverviewJob
    goodput: OverviewGoodput | None
    incidents: list[IncidentMark] = Field(description="the 50 newest")


class RankCompute(BaseModel):
    rank: int
    compute_s: list[float | None]


class EvidenceChart(BaseModel):
    step: list[int]
    median: list[float | None] = Field(description="median compute time (s) over all ranks")
    ranks: list[RankCompute] = Field(description="the incident's named ranks (at most 8)")
    first_step: int | None
