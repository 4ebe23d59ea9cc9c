"""``POST /api/v1/ingest/multi``: many ingest batches in one request, for the per-host relay
(``collector.relay``), so a node's ranks cost the server one request per flush, not one each.

The body is NDJSON (``Content-Type: application/x-ndjson``, gzip allowed, at most
``VIGIL_MAX_BODY_BYTES`` before and after gzip): one ingest batch per line, each exactly the
body ``POST /api/v1/ingest`` takes; blank lines are skipped. Each line is validated,
deduplicated on its ``batch_id`` and stored on its own, in its own transaction: all of a
line or nothing of it, whatever the other lines do. The reply lists one result per batch,
in the order of the lines::

    {"results": [
      {"status": 200, "accepted": 3, "duplicate": false, "actions": [...]},
      {"status": 422, "error": "invalid", "detail": [{"field": "events[0].ts", ...}]},
      {"status": 429, "error": "throttled", "detail": "...", "retry_after": 2}
    ]}

A result is what ``/api/v1/ingest`` would have answered that batch alone — its body with the
status added (and ``retry_after``, the ``Retry-After`` it would have sent) — so the relay
hands each rank its own answer, the actions the server holds for that rank included. A
line's content hash is the SHA-256 of its bytes, as a lone batch's is of its body: a rank's
retry is the same batch whether it comes alone or inside a relay's request.

The request takes one admission slot (``IngestGate``) and one thread; when the gate is full,
a request of heartbeat-only lines (a relay sends a flush's heartbeats so, apart from its
telemetry) takes a slot of the heartbeat lane instead (``backend.ingest.admission``), so an
overload does not silence a whole node's live ranks at once. Its valid lines are
stored in bulk, in one transaction (``backend.ingest.bulk``: a statement per table, not per
line; one Redis round trip for the ranks' liveness), each answered as it would be alone,
and only once the transaction committed. Should that transaction fail for any other reason
than a refusal of a line (a database error one line sets off, a bug), it is rolled back and
each line is stored in its own transaction, as alone, so one bad line cannot fail the
others. A busy database (the connection pool exhausted, SQLite's "locked") gets every line
a 429. When the database stops answering (an ``OperationalError``), the line and the ones
not tried yet get a 503 with ``retry_after``: retried, they are stored once.
"""

from __future__ import annotations

import hashlib
import logging
import time
from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Request
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import exc as sa_exc

from backend.auth.deps import require_scope
from backend.db import session_scope
from backend.errors import INTERNAL_DETAIL, DomainError, code_for, error_body, errors
from backend.ingest.admission import MULTI_MAX_BYTES, heartbeat_lines
from backend.ingest.bulk import ingest_batches
from backend.ingest.schemas import IngestBatch
from backend.ingest.views import (
    _parse,
    _store,
    _throttled,
    admitted,
    is_busy,
    mark_for_detection,
    stored_reply,
)
from backend.metrics import INGEST_BATCHES, INGEST_REQUESTS
from backend.settings import Settings

log = logging.getLogger(__name__)

router = APIRouter(tags=["ingest"])

NDJSON = "application/x-ndjson"
# Lines per request. A relay sends one per rank of its node and flush (hundreds at most);
# the bound keeps one request from holding a thread and a transaction for long.
MAX_BATCHES = 1000


class BatchResult(BaseModel):
    """One line's answer: ``/api/v1/ingest``'s reply or error body, with its status."""

    model_config = ConfigDict(extra="allow")

    status: int = Field(examples=[200], description="The status the batch alone would get.")
    accepted: int | None = Field(None, description="Events accepted (status 200).")
    duplicate: bool | None = Field(None, description="A retry of a stored batch (200).")
    actions: list[dict[str, Any]] | None = Field(
        None, description="Actions for the batch's rank (200), as in an ingest reply."
    )
    error: str | None = Field(None, description="The error's code (4xx/5xx).")
    detail: Any = Field(None, description="The error's message or invalid fields (4xx/5xx).")
    retry_after: int | None = Field(None, description="Seconds to wait before a retry (429/503).")


class MultiReply(BaseModel):
    results: list[BatchResult] = Field(description="One per non-blank line, in order.")


BODY_DOC = {
    "requestBody": {
        "required": True,
        "content": {
            NDJSON: {
                "schema": {"type": "string", "description": "One ingest batch (JSON) per line."}
            }
        },
    }
}


@router.post(
    "/api/v1/ingest/multi",
    response_model=MultiReply,
    response_model_exclude_none=True,
    openapi_extra=BODY_DOC,
    responses=errors(400, 413, 415, 429),
)
async def ingest_multi(request: Request, _: Any = Depends(require_scope("ingest"))) -> Any:
    """Store several ingest batches (NDJSON, one per line), each on its own; one result per
    batch, in order. Made for the per-host relay; gzip allowed."""
    INGEST_REQUESTS.labels("multi").inc()
    return await admitted(
        request,
        _store_body,
        content_type=NDJSON,
        lane_bytes=MULTI_MAX_BYTES,
        lane_rule=heartbeat_lines,
    )


def _store_body(request: Request, body: bytes) -> dict[str, Any]:
    return {"results": _store_lines(request, split_lines(body))}


def split_lines(body: bytes) -> list[bytes]:
    """The body's non-blank lines; a body with none, or with too many, is refused."""
    lines = [line for line in body.split(b"\n") if line.strip()]
    if not lines:
        raise DomainError("body holds no batch: send one ingest batch (JSON) per line")
    if len(lines) > MAX_BATCHES:
        raise HTTPException(
            413, f"batches: {len(lines)} lines exceed the limit of {MAX_BATCHES} per request"
        )
    return lines


def _store_lines(request: Request, lines: list[bytes]) -> list[dict[str, Any]]:
    settings: Settings = request.app.state.settings
    started = time.perf_counter()
    results: list[dict[str, Any] | None] = [None] * len(lines)
    valid: list[tuple[int, IngestBatch, str]] = []
    for index, line in enumerate(lines):
        try:
            batch = _parse(line, settings)
        except (DomainError, HTTPException) as exc:
            INGEST_BATCHES.labels("rejected").inc()
            results[index] = _refusal(exc)
        else:
            valid.append((index, batch, hashlib.sha256(line).hexdigest()))
    if valid:
        try:
            _store_bulk(request, valid, results, started)
        except (sa_exc.TimeoutError, sa_exc.OperationalError) as exc:
            pool = isinstance(exc, sa_exc.TimeoutError)
            if pool or is_busy(exc):  # type: ignore[arg-type]
                why = "database connection pool exhausted" if pool else "database is busy"
                for index, _, _ in valid:
                    results[index] = _http_result(_throttled(settings, why))
            else:  # the line that failed, or the database: each line finds out alone
                log.warning("ingest/multi: the database failed; storing each line alone")
                _store_each(request, [(i, lines[i]) for i, _, _ in valid], results)
        except Exception:  # one line's rows the database refused, a bug: each line alone
            log.warning(
                "ingest/multi: storing %d lines in one transaction failed; storing each alone",
                len(valid),
                exc_info=True,
            )
            _store_each(request, [(i, lines[i]) for i, _, _ in valid], results)
    assert all(r is not None for r in results)
    return results  # type: ignore[return-value]


def _store_bulk(
    request: Request,
    valid: list[tuple[int, IngestBatch, str]],
    results: list[dict[str, Any] | None],
    started: float,
) -> None:
    with session_scope(request.app.state.sessionmaker, write=True) as session:
        outcomes = ingest_batches(session=session, batches=[(b, d) for _, b, d in valid])
    # Committed: now the lines may be answered.
    seconds = (time.perf_counter() - started) / len(valid)
    marked: dict[int, None] = {}
    for (index, batch, _), outcome in zip(valid, outcomes, strict=True):
        if isinstance(outcome, DomainError):
            INGEST_BATCHES.labels("rejected").inc()
            results[index] = _refusal(outcome)
            continue
        if outcome.counts:
            marked[outcome.job_id] = None
        results[index] = {"status": 200, **stored_reply(batch, outcome, seconds).model_dump()}
    mark_for_detection(request, list(marked))


def _store_each(
    request: Request, lines: list[tuple[int, bytes]], results: list[dict[str, Any] | None]
) -> None:
    """Each line in its own transaction, as ``/api/v1/ingest`` stores a batch."""
    settings: Settings = request.app.state.settings
    for n, (index, line) in enumerate(lines):
        try:
            reply = _store(request, line)
        except (DomainError, HTTPException) as exc:
            results[index] = _refusal(exc)
        except sa_exc.OperationalError:
            log.warning("ingest/multi: the database failed at line %d", index, exc_info=True)
            for left, _ in lines[n:]:
                results[left] = _unavailable(settings)
            return
        except Exception:  # a bug one batch sets off must not fail the others
            log.error("ingest/multi: unexpected error at line %d", index, exc_info=True)
            results[index] = error_body(500, "internal", INTERNAL_DETAIL)
        else:
            results[index] = {"status": 200, **reply.model_dump()}


def _refusal(exc: DomainError | HTTPException) -> dict[str, Any]:
    if isinstance(exc, HTTPException):
        return _http_result(exc)
    body: dict[str, Any] = error_body(exc.status, exc.code, exc.detail, exc.extra)
    return body


def _http_result(exc: HTTPException) -> dict[str, Any]:
    result: dict[str, Any] = error_body(exc.status_code, code_for(exc.status_code), exc.detail)
    retry = (exc.headers or {}).get("Retry-After")
    if retry is not None:
        result["retry_after"] = int(retry)
    return result


def _unavailable(settings: Settings) -> dict[str, Any]:
    result: dict[str, Any] = error_body(
        503, "unavailable", "the database is not answering; retry later"
    )
    result["retry_after"] = settings.retry_after_s
    return result
