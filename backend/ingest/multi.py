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

The request takes one admission slot (``IngestGate``) and one thread; its lines are stored
one after another. When the database stops answering (an ``OperationalError`` other than
SQLite's "locked", which is a 429), that line and the ones not tried yet get a 503 with
``retry_after``: retried, they are stored once.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Request
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import exc as sa_exc
from starlette.concurrency import run_in_threadpool

from backend.auth.deps import require_scope
from backend.errors import INTERNAL_DETAIL, DomainError, code_for, error_body, errors
from backend.ingest.views import IngestGate, _read_body, _store, _throttled
from backend.metrics import INGEST_REQUESTS
from backend.settings import Settings

log = logging.getLogger(__name__)

router = APIRouter(tags=["ingest"])

NDJSON = "application/x-ndjson"
# Lines per request. A relay sends one per rank of its node and flush (hundreds at most);
# the bound keeps one request from holding a thread for thousands of transactions.
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
    settings: Settings = request.app.state.settings
    gate: IngestGate = request.app.state.ingest_gate
    INGEST_REQUESTS.labels("multi").inc()
    if not gate.try_enter():
        raise _throttled(settings, f"{gate.limit} requests in flight")
    try:
        body = await _read_body(request, settings.max_body_bytes, NDJSON)
        lines = split_lines(body)
        return {"results": await run_in_threadpool(_store_lines, request, lines)}
    finally:
        gate.leave()


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
    results: list[dict[str, Any]] = []
    for index, line in enumerate(lines):
        try:
            reply = _store(request, line)
        except DomainError as exc:
            results.append(error_body(exc.status, exc.code, exc.detail, exc.extra))
        except HTTPException as exc:
            results.append(_http_result(exc))
        except sa_exc.OperationalError:
            log.warning("ingest/multi: the database failed at line %d", index, exc_info=True)
            left = len(lines) - index
            results.extend(_unavailable(settings) for _ in range(left))
            break
        except Exception:  # a bug one batch sets off must not fail the others
            log.error("ingest/multi: unexpected error at line %d", index, exc_info=True)
            results.append(error_body(500, "internal", INTERNAL_DETAIL))
        else:
            results.append({"status": 200, **reply.model_dump()})
    return results


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
