"""The ingest contract (DESIGN.md, "Ingest"), as pydantic types.

Events validate into plain dicts (TypedDicts), not model instances, because a batch can
hold tens of thousands of them and they go straight into bulk INSERTs. Unknown fields are
ignored, so an older server accepts batches from a newer collector; unknown event types
are refused, since silently dropping data would be worse.

NaN and ±Inf are allowed only where they are the signal (``loss``, ``grad_norm``, a
metric's ``value``); everywhere else they are refused with the field named.

Every field is bounded by what its column holds, so bad input is a 422 naming the field,
never a database error (a 5xx, which a collector retries forever): strings carry no NUL
character, integers fit their INTEGER/BIGINT columns, timestamps are below
``MAX_TIMESTAMP`` and durations at most ``MAX_DURATION_S`` (so rollup sums stay finite),
and free-form JSON is plain (``backend.ingest.plain_json``).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, NotRequired

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
)
from typing_extensions import TypedDict

from backend.ingest.plain_json import plain_json
from backend.ingest.tokens import MAX_RECORDED as MAX_RECORDED_TOKENS
from backend.ingest.tokens import TokenTimesError, decode_offsets

MAX_STEP = 2**53 - 1  # the largest integer a JavaScript client reads back exactly
MAX_RANKS = 1_000_000
MAX_NAME = 128
MAX_INT32 = 2**31 - 1  # INTEGER columns
MAX_INT64 = 2**63 - 1  # BIGINT columns
# torchrun's restart count. A launch restarts a handful of times (``--max-restarts``), so
# this is generous; it keeps an absurd attempt from ever reaching the job (see
# ``backend.jobs.attempts`` for how a job follows its attempts).
MAX_ATTEMPT = 10_000
# Timestamps are epoch seconds (or seconds from any origin ≥ 0, as a replayed trace has),
# below 1e10 (the year 2286): a millisecond timestamp by mistake is refused, and minute
# numbers stay far inside a BIGINT.
MAX_TIMESTAMP = 1e10
# Durations are at most a week. It bounds every rollup sum: a bin's 2**31 rows at most
# (its INTEGER count) times a week is 1.3e15 s, so a sum never overflows a double (two
# 1e308 durations would, and PostgreSQL refuses an overflowing float addition).
MAX_DURATION_S = 7 * 24 * 3600.0

# A NUL character cannot be stored in a PostgreSQL text or JSON column; every string field
# refuses it (``views`` words the pattern's error as "must not contain a NUL character").
NO_NUL = r"^[^\x00]*$"

Timestamp = Annotated[float, Field(ge=0, lt=MAX_TIMESTAMP, allow_inf_nan=False)]
Seconds = Annotated[float, Field(ge=0, le=MAX_DURATION_S, allow_inf_nan=False)]


def _no_bool(value: Any) -> Any:
    if isinstance(value, bool):  # JSON's true/false are no integers (pydantic takes them)
        raise ValueError("Input should be a valid integer, not a boolean")
    return value


NOT_BOOL = BeforeValidator(_no_bool)
StepNo = Annotated[int, NOT_BOOL, Field(ge=0, le=MAX_STEP)]
Count = Annotated[int, NOT_BOOL, Field(ge=0, le=MAX_INT64)]
Int32 = Annotated[int, NOT_BOOL, Field(ge=0, le=MAX_INT32)]
Name = Annotated[str, Field(min_length=1, max_length=MAX_NAME, pattern=NO_NUL)]
OpName = Annotated[str, Field(min_length=1, max_length=64, pattern=NO_NUL)]
Hash = Annotated[str, Field(max_length=64, pattern=NO_NUL)]
Fingerprint = Annotated[str, Field(min_length=1, max_length=64, pattern=NO_NUL)]
# Values where NaN/Inf is meaningful and kept.
Signal = float
# Free-form JSON (event attrs, an op sequence, an action's result): checked by
# ``plain_json`` so that it fits any JSON column.
FreeDict = Annotated[dict[str, Any], AfterValidator(plain_json)]
FreeList = Annotated[list[Any], Field(max_length=200_000), AfterValidator(plain_json)]


class StepEvent(TypedDict):
    type: Literal["step"]
    step: StepNo
    ts: Timestamp
    duration_s: Seconds
    comm_s: NotRequired[Seconds | None]
    data_s: NotRequired[Seconds | None]
    loss: NotRequired[Signal | None]
    grad_norm: NotRequired[Signal | None]
    mem_bytes: NotRequired[Count | None]
    tokens: NotRequired[Count | None]
    opseq: NotRequired[Hash | None]
    # Activation swapping (issue 14): the step's structural fingerprint (every step), the
    # swap-policy version it ran under and the peak the swap executor measured.
    shape_fp: NotRequired[Fingerprint | None]
    swap_policy: NotRequired[Int32 | None]
    swap_peak_bytes: NotRequired[Count | None]


class CollectiveEvent(TypedDict):
    type: Literal["collective"]
    group: Name
    op: OpName
    duration_s: Seconds
    step: NotRequired[StepNo | None]
    seq: NotRequired[Count | None]
    bytes: NotRequired[Count]
    count: NotRequired[Annotated[int, NOT_BOOL, Field(ge=1, le=MAX_INT32)]]
    members: NotRequired[
        Annotated[
            list[Annotated[int, NOT_BOOL, Field(ge=0, lt=MAX_RANKS)]], Field(max_length=MAX_RANKS)
        ]
        | None
    ]


class Inflight(TypedDict):
    group: Name
    op: OpName
    since: Timestamp
    seq: NotRequired[Count | None]
    # A point-to-point op (send/recv, a batch of them): the global ranks on the other side
    # whose transfer has not finished; [] a receive from any source. Absent: a collective.
    peers: NotRequired[
        Annotated[
            list[Annotated[int, NOT_BOOL, Field(ge=0, lt=MAX_RANKS)]], Field(max_length=MAX_RANKS)
        ]
        | None
    ]


class HeartbeatEvent(TypedDict):
    type: Literal["heartbeat"]
    ts: Timestamp
    step: NotRequired[StepNo | None]
    inflight: NotRequired[Inflight | None]
    pid: NotRequired[Int32 | None]
    exiting: NotRequired[bool]
    dropped: NotRequired[dict[Hash, Count] | None]
    # Device memory in bytes (CUDA total memory, or VIGIL_MEMORY_BUDGET_BYTES on CPU), and
    # whether the rank runs a swap executor that can apply ``apply_swap_policy``.
    mem_capacity: NotRequired[Count | None]
    swap: NotRequired[bool]
    # With ``exiting``: the process's exit code when the collector knows it (0: a clean
    # exit; an uncaught exception or an exit for a restart otherwise). ``backend.jobs.runs``.
    exit_code: NotRequired[Annotated[int, NOT_BOOL, Field(ge=-MAX_INT32, le=MAX_INT32)] | None]


def _named_ops(ops: list[Any]) -> list[Any]:
    """Each op is a list whose first item is its name (``[name, shapes, saved_bytes]``):
    ingest hashes the names into the sequence's ``structure``."""
    for j, op in enumerate(ops):
        if not (isinstance(op, list) and op and isinstance(op[0], str) and op[0]):
            raise ValueError(f"ops[{j}] must be a list whose first item is the op's name")
    return ops


class OpSeqEvent(TypedDict):
    type: Literal["opseq"]
    hash: Fingerprint
    ops: Annotated[FreeList, AfterValidator(_named_ops)]
    # The profiled step (PROFILE of ``detectors.swap``), shipped with a new sequence.
    profile: NotRequired[FreeDict | None]


class TokenTimes(TypedDict):
    """Output tokens' delivery times, compact (``backend.ingest.tokens`` has the format)."""

    enc: Literal["dv1"]
    stride: NotRequired[Annotated[int, NOT_BOOL, Field(ge=1, le=MAX_INT32)]]
    data: Annotated[str, Field(max_length=4 * MAX_RECORDED_TOKENS, pattern=NO_NUL)]


class RequestEvent(TypedDict):
    """One served request. ``status``: ``ok``, ``error``, ``aborted_by_client`` or
    ``rejected`` (other values are kept and count as not ``ok``)."""

    type: Literal["request"]
    id: Name
    arrival: Timestamp
    first_token: NotRequired[Timestamp | None]
    end: NotRequired[Timestamp | None]
    prompt_tokens: NotRequired[Int32 | None]
    output_tokens: NotRequired[Int32 | None]
    max_tbt_s: NotRequired[Seconds | None]
    status: NotRequired[Annotated[str, Field(min_length=1, max_length=32, pattern=NO_NUL)]]
    queue_s: NotRequired[Seconds | None]
    model: NotRequired[Name | None]
    replica: NotRequired[Name | None]
    token_times: NotRequired[TokenTimes | None]


class MetricEvent(TypedDict):
    type: Literal["metric"]
    name: Name
    value: Signal
    step: NotRequired[StepNo | None]
    ts: NotRequired[Timestamp | None]


class NamedEvent(TypedDict):
    type: Literal["event"]
    name: Name
    step: NotRequired[StepNo | None]
    ts: NotRequired[Timestamp | None]
    attrs: NotRequired[FreeDict]


class ActionEvent(TypedDict):
    """A rank reporting on an action it received: acked, then succeeded or failed."""

    type: Literal["action"]
    id: Annotated[int, NOT_BOOL, Field(ge=1, le=MAX_INT32)]
    state: Literal["acked", "succeeded", "failed"]
    ts: NotRequired[Timestamp | None]
    result: NotRequired[FreeDict | None]


Event = Annotated[
    StepEvent
    | CollectiveEvent
    | HeartbeatEvent
    | OpSeqEvent
    | RequestEvent
    | MetricEvent
    | NamedEvent
    | ActionEvent,
    Field(discriminator="type"),
]
EVENT_TYPES = ("step", "collective", "heartbeat", "opseq", "request", "metric", "event", "action")

# Job names appear in URLs, so no '/', and in terminals, so no control characters.
_JOB_NAME = re.compile(r"^[^/\x00-\x1f\x7f]{1,200}$")
_BATCH_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")
RUN_KEY = r"^[^\x00-\x1f\x7f]+$"  # shown on pages and in terminals: no control characters


class IngestBatch(BaseModel):
    model_config = ConfigDict(extra="ignore")

    batch_id: str
    job: str
    kind: Literal["training", "serving"] = "training"
    # world_size is declared first so that the rank check can see it.
    world_size: Annotated[int, NOT_BOOL, Field(ge=1, le=MAX_RANKS)] = 1
    rank: Annotated[int, NOT_BOOL, Field(ge=0, lt=MAX_RANKS)] = 0
    host: Annotated[str, Field(max_length=255, pattern=NO_NUL)] | None = None
    attempt: Annotated[int, NOT_BOOL, Field(ge=0, le=MAX_ATTEMPT)] = 0
    # The launch the batch is from (``vigil run``'s or torchrun's run id): a new key is a
    # new run of the job (``backend.jobs.runs``); without one, the job's current run.
    run: Annotated[str, Field(min_length=1, max_length=MAX_NAME, pattern=RUN_KEY)] | None = None
    events: list[Event] = Field(default_factory=list)

    @field_validator("batch_id")
    @classmethod
    def _batch_id(cls, value: str) -> str:
        if not _BATCH_ID.match(value):
            raise ValueError("must be 1-64 characters of letters, digits, '-', '_', '.', ':'")
        return value

    @field_validator("job")
    @classmethod
    def _job(cls, value: str) -> str:
        if not value.strip() or not _JOB_NAME.match(value):
            raise ValueError("must be 1-200 characters, without '/' or control characters")
        return value

    @field_validator("rank")
    @classmethod
    def _rank_in_world(cls, value: int, info: ValidationInfo) -> int:
        world = info.data.get("world_size")
        if world is not None and value >= world:
            raise ValueError(f"rank {value} is out of range for world_size {world}")
        return value


class IngestReply(BaseModel):
    accepted: int
    duplicate: bool
    actions: list[dict[str, Any]] = Field(default_factory=list)


def format_loc(loc: tuple[int | str, ...]) -> str:
    """``('events', 3, 'step', 'duration_s')`` → ``'events[3].duration_s'``.

    The discriminated union puts the event type into the path; it is dropped, since the
    reader already knows the type from the event itself.
    """
    out = ""
    previous: int | str | None = None
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif isinstance(previous, int) and part in EVENT_TYPES and out.startswith("events"):
            pass
        else:
            out += f".{part}" if out else str(part)
        previous = part
    return out or "body"


def check_request_times(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Cross-field checks pydantic cannot express on a TypedDict: request phases in order,
    token times that decode and fit the request. A request's decoded token offsets are
    kept on the event (``_token_offsets``) for ingest."""
    errors: list[dict[str, Any]] = []
    for i, ev in enumerate(events):
        if ev["type"] != "request":
            continue
        arrival, first, end = ev["arrival"], ev.get("first_token"), ev.get("end")
        if first is not None and first < arrival:
            errors.append(_error(f"events[{i}].first_token", "is before arrival"))
        if end is not None and end < (first if first is not None else arrival):
            errors.append(_error(f"events[{i}].end", "is before first_token/arrival"))
        if ev.get("token_times") is not None:
            errors += _check_token_times(ev, f"events[{i}].token_times")
    return errors


TOKEN_SLACK_S = 1e-3  # rounding to 100 µs, plus clock jitter between the tokens and `end`


def _check_token_times(ev: dict[str, Any], where: str) -> list[dict[str, Any]]:
    times, first, end = ev["token_times"], ev.get("first_token"), ev.get("end")
    n = ev.get("output_tokens")
    if first is None or n is None:
        return [_error(where, "needs first_token and output_tokens")]
    try:
        offsets = decode_offsets(times["data"], stride=times.get("stride", 1), output_tokens=n)
    except TokenTimesError as exc:
        return [_error(f"{where}.data", str(exc))]
    if end is not None and first + offsets[-1] > end + TOKEN_SLACK_S:
        return [_error(f"{where}.data", f"the last token ({first + offsets[-1]:.6f}) is after end")]
    ev["_token_offsets"] = offsets
    return []


def _error(field: str, msg: str) -> dict[str, Any]:
    return {"field": field, "msg": msg, "type": "value_error"}
