"""``POST /api/v1/ingest``: the one endpoint collectors talk to."""

from __future__ import annotations

import hashlib
import threading
import time
import zlib
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Request
from pydantic import ValidationError
from sqlalchemy import exc as sa_exc
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect

from backend.auth.deps import require_scope
from backend.db import session_scope
from backend.detection.schedule import DetectionScheduler
from backend.errors import DomainError, Invalid
from backend.ingest.admission import LANE_MAX_BYTES, declared_small, heartbeat_only
from backend.ingest.schemas import (
    NO_NUL,
    IngestBatch,
    IngestReply,
    check_request_times,
    format_loc,
)
from backend.ingest.service import IngestResult, ingest_batch
from backend.metrics import INGEST_BATCHES, INGEST_EVENTS, INGEST_REQUESTS, INGEST_SECONDS
from backend.settings import Settings
from backend.telemetry.prometheus import observe_requests

router = APIRouter(tags=["ingest"])


class IngestGate:
    """Admission control: at most ``limit`` batches in flight per process; the rest get 429.

    Rejecting early is kinder than queueing: collectors keep their buffer and retry
    after ``Retry-After``, while a queue here would only grow latency and memory.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._inflight = 0
        self._lock = threading.Lock()

    def try_enter(self) -> bool:
        with self._lock:
            if self._inflight >= self.limit:
                return False
            self._inflight += 1
            return True

    def leave(self) -> None:
        with self._lock:
            self._inflight -= 1


def _throttled(settings: Settings, why: str) -> HTTPException:
    INGEST_BATCHES.labels("throttled").inc()
    return HTTPException(
        429,
        f"server saturated ({why}); retry later",
        headers={"Retry-After": str(settings.retry_after_s)},
    )


@router.post(
    "/api/v1/ingest",
    response_model=IngestReply,
    responses={
        400: {"description": "Body is not valid JSON or gzip"},
        401: {"description": "Missing or invalid token"},
        409: {
            "description": "Batch conflicts with the stored job (its kind), or reuses a "
            "batch_id with different content"
        },
        413: {"description": "Body too large"},
        415: {"description": "Unsupported content type or encoding"},
        422: {"description": "A field is invalid; `detail[].field` names it"},
        429: {"description": "Server saturated; honour Retry-After"},
    },
)
async def ingest(request: Request, _: Any = Depends(require_scope("ingest"))) -> Any:
    """Store a batch of events from one rank. Idempotent on ``batch_id``; gzip allowed."""
    INGEST_REQUESTS.labels("single").inc()
    return await admitted(request, _store)


async def admitted(
    request: Request,
    store: Callable[[Request, bytes], Any],
    *,
    content_type: str = "application/json",
    lane_bytes: int = LANE_MAX_BYTES,
    lane_rule: Callable[[bytes], bool] = heartbeat_only,
) -> Any:
    """``store(request, body)`` (in a thread) under an admission slot: the ingest gate's;
    when it is full, the heartbeat lane's for a body of at most ``lane_bytes`` (before and
    after gzip) that ``lane_rule`` takes (``backend.ingest.admission``), so overload does not
    make live ranks look crashed; else 429."""
    settings: Settings = request.app.state.settings
    gate: IngestGate = request.app.state.ingest_gate
    if gate.try_enter():
        try:
            body = await _read_body(request, settings.max_body_bytes, content_type)
            return await run_in_threadpool(store, request, body)
        finally:
            gate.leave()
    busy = f"{gate.limit} requests in flight"
    lane: IngestGate = request.app.state.liveness_gate
    if not (declared_small(request, lane_bytes) and lane.try_enter()):
        raise _throttled(settings, busy)
    try:
        beats = await _lane_body(request, lane_bytes, content_type)
        if beats is None or not lane_rule(beats):
            raise _throttled(settings, busy)
        return await run_in_threadpool(store, request, beats)
    finally:
        lane.leave()


async def _lane_body(request: Request, limit: int, content_type: str) -> bytes | None:
    """The body, when it is at most ``limit`` bytes before and after gzip."""
    try:
        return await _read_body(request, limit, content_type)
    except HTTPException as exc:
        if exc.status_code == 413:  # too big for the lane: the batch is not at fault
            return None
        raise


async def _read_body(request: Request, limit: int, content_type: str = "application/json") -> bytes:
    ctype = request.headers.get("content-type", content_type).split(";")[0].strip()
    if ctype not in (content_type, ""):
        raise HTTPException(415, f"content-type must be {content_type}, not {ctype!r}")
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise HTTPException(413, f"body of {declared} bytes exceeds the {limit}-byte limit")
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise HTTPException(413, f"body exceeds the {limit}-byte limit")
            chunks.append(chunk)
    except ClientDisconnect:
        # The sender gave up mid-body (its timeout): nothing to store, nobody to answer; not
        # a server error (at 512 ranks this logged thousands of tracebacks as 500s).
        raise HTTPException(400, "the client disconnected before the body was complete") from None
    body = b"".join(chunks)
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding == "gzip":
        return _gunzip(body, limit)
    if encoding not in ("identity", ""):
        raise HTTPException(415, f"content-encoding must be gzip or identity, not {encoding!r}")
    return body


def _gunzip(body: bytes, limit: int) -> bytes:
    inflater = zlib.decompressobj(wbits=31)
    try:
        out = inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        raise HTTPException(400, f"body is not valid gzip: {exc}") from None
    if len(out) > limit or inflater.unconsumed_tail:
        raise HTTPException(413, f"decompressed body exceeds the {limit}-byte limit")
    if not inflater.eof:
        raise HTTPException(400, "body is not valid gzip: truncated stream")
    if inflater.unused_data:
        # A second member or trailing bytes: zlib stops after the first member, so they
        # would be dropped without a word. One member, nothing after it.
        raise HTTPException(
            400,
            f"body is not valid gzip: {len(inflater.unused_data)} bytes after the end of the "
            "gzip stream (send one gzip member and nothing after it)",
        )
    return out


def _store(request: Request, body: bytes) -> Any:
    settings: Settings = request.app.state.settings
    started = time.perf_counter()
    try:
        batch = _parse(body, settings)
        with session_scope(request.app.state.sessionmaker, write=True) as session:
            # The decompressed body's hash: a retry (same body, however compressed) is a
            # duplicate; the same batch_id with other content is a 409.
            digest = hashlib.sha256(body).hexdigest()
            result = ingest_batch(session=session, batch=batch, content_hash=digest)
    except (DomainError, HTTPException):  # refused (e.g. JobKindConflict): nothing stored
        INGEST_BATCHES.labels("rejected").inc()
        raise
    except sa_exc.TimeoutError:
        raise _throttled(settings, "database connection pool exhausted") from None
    except sa_exc.OperationalError as exc:
        if is_busy(exc):
            raise _throttled(settings, "database is busy") from None
        raise
    if result.counts:
        mark_for_detection(request, [result.job_id])
    return stored_reply(batch, result, time.perf_counter() - started)


def is_busy(exc: sa_exc.OperationalError) -> bool:
    """SQLite's "database is locked": the database is busy (a 429), not failing."""
    return "locked" in str(exc.orig).lower()


def mark_for_detection(request: Request, job_ids: list[int]) -> None:
    """After the commit: the jobs have new data, detection runs for them follow."""
    scheduler: DetectionScheduler | None = request.app.state.detection_scheduler
    if scheduler is not None:
        for job_id in job_ids:
            scheduler.mark(job_id)


def stored_reply(batch: IngestBatch, result: IngestResult, seconds: float) -> IngestReply:
    """After the commit: the batch's metrics, and its reply."""
    if result.counts.get("request"):
        observe_requests(batch.job, [e for e in batch.events if e["type"] == "request"])  # type: ignore[misc]
    INGEST_SECONDS.observe(seconds)
    INGEST_BATCHES.labels("duplicate" if result.duplicate else "stored").inc()
    for kind, n in result.counts.items():
        INGEST_EVENTS.labels(kind).inc(n)
    return IngestReply(accepted=result.accepted, duplicate=result.duplicate, actions=result.actions)


def _parse(body: bytes, settings: Settings) -> IngestBatch:
    """The batch, or the error naming what is wrong with it."""
    try:
        batch = IngestBatch.model_validate_json(body)
    except ValidationError as exc:
        raise _validation_error(exc) from None
    if len(batch.events) > settings.max_events_per_batch:
        raise HTTPException(
            413,
            f"events: {len(batch.events)} events exceed the limit of "
            f"{settings.max_events_per_batch} per batch; send smaller batches",
        )
    if errors := check_request_times(batch.events):  # type: ignore[arg-type]
        raise Invalid(errors)
    return batch


def _validation_error(exc: ValidationError) -> DomainError:
    errors = exc.errors(include_url=False, include_input=False)
    if errors and errors[0]["type"] == "json_invalid":
        return DomainError(f"body is not valid JSON: {errors[0]['msg']}")
    detail = [
        {"field": format_loc(tuple(e["loc"])), "msg": _message(e), "type": e["type"]}
        for e in errors[:50]
    ]
    return Invalid(detail)


def _message(error: Any) -> str:
    if error["type"] == "string_pattern_mismatch" and error.get("ctx", {}).get("pattern") == NO_NUL:
        return "must not contain a NUL character (\\u0000)"
    return str(error["msg"]).removeprefix("Value error, ")
