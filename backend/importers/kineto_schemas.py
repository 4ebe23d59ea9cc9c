"""Bodies of ``POST /api/v1/jobs/{job}/imports/kineto``.

The client (``vigil import kineto``) reads the traces and sends what Vigil stores, per rank
and iteration: a few hundred bytes an iteration instead of the trace's megabytes to
gigabytes, so a real trace fits the 8 MiB body limit (``VIGIL_MAX_BODY_BYTES``) and the
server never parses a trace. Bounds are the ingest contract's (``backend.ingest.schemas``):
what passes here also passes as the ingest batch it is stored as.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from backend.ingest.schemas import (
    MAX_INT32,
    MAX_RANKS,
    NO_NUL,
    NOT_BOOL,
    Count,
    FreeList,
    Hash,
    Name,
    OpName,
    StepNo,
)
from backend.ingest.schemas import Seconds as _Seconds
from backend.ingest.schemas import Timestamp as _Timestamp

Rank = Annotated[int, NOT_BOOL, Field(ge=0, lt=MAX_RANKS)]
# JSON's true/false are no numbers here either.
Seconds = Annotated[_Seconds, NOT_BOOL]
Timestamp = Annotated[_Timestamp, NOT_BOOL]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class GpuIn(_Strict):
    """One iteration's GPU time as Holistic Trace Analysis defines it (seconds)."""

    span_s: Seconds = Field(description="First GPU event's start to the last one's end.")
    idle_s: Seconds = Field(description="The span less the time any stream was busy.")
    compute_s: Seconds = Field(description="Union of computation kernels.")
    non_compute_s: Seconds = Field(description="span − compute − idle.")
    comm_s: Seconds = Field(description="Union of NCCL kernels.")
    overlap_s: Seconds = Field(description="NCCL and computation kernels at once.")


class IterationIn(_Strict):
    step: StepNo = Field(description="N of ProfilerStep#N.")
    ts: Timestamp = Field(description="The step's end, epoch seconds.")
    duration_s: Seconds = Field(description="ProfilerStep#N's wall time on the CPU.")
    comm_s: Seconds | None = Field(
        None,
        description="Stored as the step's time in collectives: exposed communication "
        "(GPU traces) or time in CPU collectives (gloo); null when none was seen.",
    )
    gpu: GpuIn | None = Field(None, description="Null for an iteration without GPU events.")
    opseq: Hash | None = Field(None, description="The op-sequence fingerprint.")


class CollectiveIn(_Strict):
    step: StepNo
    group: Name
    op: OpName
    duration_s: Seconds = Field(description="Kernel (or CPU collective) time in the step.")
    count: Annotated[int, NOT_BOOL, Field(ge=1, le=MAX_INT32)] = Field(description="Calls.")
    bytes: Count = 0
    members: Annotated[list[Rank], Field(max_length=MAX_RANKS)] | None = None


class OpSeqIn(_Strict):
    hash: Annotated[str, Field(min_length=1, max_length=64, pattern=NO_NUL)]
    ops: FreeList = Field(description="`[name, input shapes, 0]` per operator.")


class RankIn(_Strict):
    """One rank's iterations (all of a trace, or a part of a big one)."""

    rank: Rank
    source: Annotated[str, Field(max_length=256, pattern=NO_NUL)] = Field(
        "", description="The trace file's name, for messages."
    )
    iterations: list[IterationIn] = Field(min_length=1, max_length=100_000)
    collectives: list[CollectiveIn] = Field(default_factory=list, max_length=1_000_000)
    opseqs: list[OpSeqIn] = Field(
        default_factory=list, max_length=10_000, description="Op sequences first seen here."
    )


class KinetoImport(_Strict):
    world_size: Annotated[int, NOT_BOOL, Field(ge=1, le=MAX_RANKS)] | None = Field(
        None, description="The job's ranks (the trace's distributedInfo); default: ranks sent."
    )
    ranks: list[RankIn] = Field(min_length=1, max_length=65_536, description="Each rank once.")


class IncidentBrief(BaseModel):
    id: int
    kind: str
    ranks: list[int]
    summary: str


class KinetoImportOut(BaseModel):
    job: str
    ranks: list[int] = Field(description="The ranks of this request.")
    iterations: int = Field(description="Iterations (steps) in it.")
    duplicates: list[int] = Field(description="Ranks whose data was stored before: kept once.")
    incidents: list[IncidentBrief] = Field(
        description="What the detectors found on the job after the import (opened or "
        "updated); filed without alerts or recovery, as the traced run is over."
    )
