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
from backend.slos.schemas import BurnRate, SloOut

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
    run: int | None = Field(None, description="the run drawn (`?run=`); absent: every run")


class IncidentMark(BaseModel):
    """An incident, as the charts mark it at its first step."""

    id: int
    run: int = Field(description="the number of the job's run it belongs to")
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
    run: int | None = Field(None, description="the run drawn (`?run=`); absent: every run")


class GroupBandwidth(BaseModel):
    group: str
    step: list[int]
    bytes_per_s: list[float | None] = Field(description="collective bytes ÷ seconds")


class Bandwidth(StepBinning):
    groups: list[GroupBandwidth]
    run: int | None = Field(None, description="the run drawn (`?run=`); absent: every run")


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


class LivenessRank(BaseModel):
    rank: int
    named: bool = Field(description="named by the incident (a culprit or a crashed rank)")
    step: list[int] = Field(description="its last steps before the incident was detected")
    step_end_s: list[float] = Field(description="when each ended, s relative to detection")
    last_step: int | None
    heartbeat_s: float | None = Field(description="latest heartbeat, s relative to detection")
    inflight: str | None = Field(description="the collective it is in: group op #seq")
    exited: bool


class NonFiniteSteps(BaseModel):
    loss: list[int]
    grad_norm: list[int]


class GroupGbps(BaseModel):
    group: str
    slow: bool = Field(description="one of the incident's slow groups (else a median)")
    step: list[int]
    gbps: list[float | None]


class EvidenceChart(BaseModel):
    """One of the charts ``backend.telemetry.evidence`` describes; ``chart`` says which,
    and only that chart's keys are present."""

    chart: Literal["compute", "numerics", "liveness", "bandwidth", "none"]
    first_step: int | None
    step: list[int] = Field(default_factory=list)
    median: list[float | None] = Field(
        default_factory=list, description="compute: median compute time (s) over all ranks"
    )
    ranks: list[RankCompute] = Field(
        default_factory=list, description="compute: the incident's named ranks (at most 8)"
    )
    loss: list[float | None] = Field(default_factory=list, description="numerics: median")
    grad_norm: list[float | None] = Field(default_factory=list, description="numerics: median")
    nonfinite: NonFiniteSteps | None = Field(
        default=None, description="numerics: steps where some rank reported NaN/Inf"
    )
    liveness: list[LivenessRank] = Field(default_factory=list)
    groups: list[GroupGbps] = Field(default_factory=list, description="bandwidth")


class StackFrame(BaseModel):
    file: str | None
    line: int | None
    function: str | None
    code: str | None = Field(description="the source line; a line that is no frame: its text")


class StackThread(BaseModel):
    thread: str
    frames: list[StackFrame] = Field(description="outermost first")
    training: bool = Field(description="the thread that runs the training loop")
    infra: bool = Field(description="the collector's own thread (vigil-*)")
    hung_frame: int | None = Field(description="training thread: its innermost frame's index")
    user_frame: int | None = Field(description="training thread: innermost frame of user code")


class StackDump(BaseModel):
    rank: int
    step: int | None
    ts: float | None
    pid: int | None
    reason: str
    signature: str | None = Field(description="same value: training threads in the same place")
    threads: list[StackThread] = Field(description="training thread first, vigil-* last")


class StackGroup(BaseModel):
    signature: str
    ranks: list[int]


class StackDumps(BaseModel):
    dumps: list[StackDump] = Field(description="the latest dump of each rank (at most 64)")
    ranks_with_dumps: int
    groups: list[StackGroup] = Field(description="ranks stuck in the same place, fewest first")


# --- the serving page (``backend.telemetry.serving_views``) -----------------------------------


class ServingCounts(BaseModel):
    """Per time bin, from the per-minute sums (a request counts in the minute it ended)."""

    requests: list[int] = Field(description="requests that ended in the bin")
    errors: list[int] = Field(description="of which failed (status not ok/aborted_by_client)")
    output_tokens_per_s: list[float | None]
    ttft_mean_s: list[float | None] = Field(description="mean time to first token")
    tpot_mean_s: list[float | None] = Field(description="mean time per output token")


class Percentiles(BaseModel):
    p50: list[float | None]
    p90: list[float | None]
    p99: list[float | None]


class LatencyPercentiles(BaseModel):
    """Per bin, over the requests that arrived in it; null where none has the metric."""

    ttft_s: Percentiles = Field(description="first_token − arrival")
    tpot_s: Percentiles = Field(description="(end − first_token) / (output_tokens − 1)")
    e2e_s: Percentiles = Field(description="end − arrival")


class ServingReplica(BaseModel):
    """One replica (``model/replica``) over the whole range."""

    replica: str
    requests: int
    errors: int
    output_tokens: int
    ttft_mean_s: float | None
    tpot_mean_s: float | None
    queue_mean_s: float | None
    ttft_p90_s: float | None = Field(description="from the requests read (see `sampled`)")


class ReplicaSeries(ServingCounts):
    replica: str


class SloSeries(BaseModel):
    """One SLO per bin, by the minute requests ended."""

    id: int
    name: str
    objective: float
    requests: list[int] = Field(description="requests judged")
    attainment: list[float | None] = Field(description="good ÷ judged; null: none judged")
    goodput_rps: list[float | None] = Field(description="good requests per second")
    goodput_tokens_per_s: list[float | None] = Field(description="output tokens of good ones")
    smooth_goodput: list[float | None] = Field(
        description="benefit (tokens, less a latency penalty) per second: detectors.smooth_goodput"
    )


class ServingChart(ServingCounts):
    since: float = Field(description="epoch seconds; the range, widened to whole minutes")
    until: float
    bin_s: int = Field(description="seconds per bin (whole minutes)")
    t: list[float] = Field(description="start of each bin, epoch seconds")
    latency: LatencyPercentiles
    latency_requests: list[int] = Field(description="requests read per bin for the percentiles")
    sampled: bool = Field(description="true: percentiles from evenly spaced time slices")
    requests_read: int
    replicas_total: int
    replicas: list[ServingReplica] = Field(description="by name; the 256 slowest at most")
    replica_series: list[ReplicaSeries] = Field(description="the 12 slowest by mean TTFT")
    slos: list[SloSeries]


class ServingSlo(SloOut):
    """An SLO with its status over its period (``GET /api/v1/jobs/{job}/slos``); the
    figures are null and ``error`` says why when they cannot be computed."""

    requests: int | None
    attainment: float | None
    attainment_by_threshold: dict[str, float | None]
    goodput_rps: float | None
    goodput_tokens_per_s: float | None
    smooth_goodput: float | None
    error_budget_remaining: float | None
    burn_rates: list[BurnRate]
    since: float | None
    until: float | None
    error: str | None


class SloWorst(BaseModel):
    name: str
    attainment: float
    objective: float


class SloHeadline(BaseModel):
    level: Literal["none", "ok", "unknown", "warning", "critical"]
    short: str = Field(examples=["SLO violated"])
    text: str = Field(description="whether the SLOs are met now, in one line")
    worst: SloWorst | None = Field(description="lowest attainment relative to its objective")


class ServingStatus(BaseModel):
    job: str
    as_of: float = Field(description="epoch seconds the burn rates are computed at")
    headline: SloHeadline
    slos: list[ServingSlo]
    incidents: list[IncidentMark] = Field(description="the 50 newest")
