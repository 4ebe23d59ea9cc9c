"""Live updates for the job page, as Server-Sent Events.

    GET /ui/jobs/llama/stream?after_step=1200&incidents=3:17:2024-…&run=2   (text/event-stream)

    event: steps
    id: 1203|3:17:2024-…
    data: {"current_step": 1203, "step": [1201, 1202, 1203], "step_time": [0.31, 0.3, 0.32]}

    event: incidents
    data: {"signature": "4:18:…", "incidents": [{"id": 18, "kind": "straggler", …}]}

The server polls the database about once a second, each time in a short-lived session on a
worker thread, and sends an event only when the job has new steps or its incidents changed;
a ``: ping`` comment every 15 s keeps proxies from closing the connection. It stops when
the browser goes away; after ``MAX_STREAM_S`` it ends the stream and the browser's
EventSource reconnects, resuming from ``Last-Event-ID``.

A stream follows one run of the job (``?run=N``, the run the page draws; default: the job's
current run): that run's steps, read for its attempts only and no further than its last
step, so an earlier run that went further never shows up as new steps; and that run's
incidents (``&all_incidents=true``: every run's, as the page's "all runs" table shows).
An earlier run gets no new steps, so its stream only watches the incidents.

Each open stream costs a poll a second, so they are capped per process: at most
``VIGIL_MAX_STREAMS_PER_TOKEN`` per token (or per browser without one, in development),
else ``429``; at most ``VIGIL_MAX_STREAMS`` in all, else ``503``; both with ``Retry-After``.
A stream's slot is freed when it ends, however it ends.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import StreamingResponse
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker
from starlette.types import Receive, Scope, Send

from backend.db import session_scope
from backend.deps import RunQuery
from backend.incidents.models import Incident
from backend.jobs.models import Rank
from backend.jobs.runs import current_run, require_run
from backend.jobs.service import get_job_id
from backend.settings import Settings
from backend.telemetry.binning import RunRows, only
from backend.telemetry.models import StepRecord
from backend.telemetry.queries import incident_marks, lowest_rank, num
from backend.ui.auth import TOKEN_COOKIE, ReadApi

router = APIRouter(tags=["dashboard"], include_in_schema=False)

POLL_S = 1.0
HEARTBEAT_S = 15.0
MAX_STREAM_S = 1800.0
MAX_POINTS = 2000


class StreamSlots:
    """Counts open streams, in total and per key (a token). ``acquire`` answers ``None``
    when the stream may open, else the status to refuse it with (429: this key has its
    share; 503: the process is full); every ``None`` must be matched by one ``release``."""

    def __init__(self, total: int, per_key: int) -> None:
        self.total = total
        self.per_key = per_key
        self._open: Counter[str] = Counter()
        self._lock = threading.Lock()

    def acquire(self, key: str) -> int | None:
        with self._lock:
            if self._open[key] >= self.per_key:
                return 429
            if sum(self._open.values()) >= self.total:
                return 503
            self._open[key] += 1
            return None

    def release(self, key: str) -> None:
        with self._lock:
            self._open[key] -= 1
            if self._open[key] <= 0:
                del self._open[key]

    def open(self) -> int:
        with self._lock:
            return sum(self._open.values())


def stream_key(request: Request) -> str:
    """Whose stream this is: the token sent (header or cookie, hashed), else the client."""
    header = request.headers.get("authorization", "")
    kind, _, token = header.partition(" ")
    secret = token.strip() if kind.lower() == "bearer" else ""
    secret = secret or request.cookies.get(TOKEN_COOKIE, "")
    if secret:
        return "token:" + hashlib.sha256(secret.encode()).hexdigest()
    return "client:" + (request.client.host if request.client else "?")


class SlotStream(StreamingResponse):
    """A streaming response that frees its slot when it ends, however it ends."""

    def __init__(self, content: AsyncIterator[str], release: Callable[[], None]) -> None:
        super().__init__(
            content,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
        self._release = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._release()


@dataclass(frozen=True)
class Follow:
    """What one stream follows: the steps of ``rows`` (one run's; ``None``: a job with no
    run recorded, every step), polled only while that run is the job's current one (an
    earlier run gets no new steps), and the incidents of run ``incidents_of`` (``None``:
    every run's)."""

    rows: RunRows | None
    live: bool
    incidents_of: int | None


def follow(
    session: Session, *, job_id: int, job: str, run: int | None = None, every_run: bool = False
) -> Follow:
    """The stream of run ``run`` of the job (default: its current run); ``every_run``: with
    every run's incidents. ``NotFound`` (404) for a run the job does not have."""
    current = current_run(session=session, job_id=job_id)
    chosen = (
        current if run is None else require_run(session=session, job_id=job_id, job=job, number=run)
    )
    if chosen is None:
        return Follow(None, True, None)
    rows = RunRows.of(chosen, alone=False)
    live = current is not None and chosen.id == current.id
    return Follow(rows, live, None if every_run else chosen.number)


def current_step(session: Session, job_id: int, rows: RunRows | None = None) -> int | None:
    """The last step of the job's ranks (of ``rows``' run only, when given)."""
    where = [Rank.job_id == job_id, *only(rows, Rank.attempt)]
    return session.scalar(select(func.max(Rank.last_step)).where(*where))


def incident_signature(session: Session, job_id: int) -> str:
    """Changes whenever an incident of the job opens, updates or resolves."""
    count, top, updated = session.execute(
        select(func.count(), func.max(Incident.id), func.max(Incident.updated_at)).where(
            Incident.job_id == job_id
        )
    ).one()
    return f"{count}:{top or 0}:{updated.isoformat() if updated else ''}"


def snapshot(
    factory: sessionmaker[Session],
    job_id: int,
    after_step: int,
    signature: str,
    scope: Follow | None = None,
) -> list[tuple[str, dict[str, Any]]]:
    """The events the browser has not seen: new steps after ``after_step`` (of the lowest
    rank, as the step-time chart draws them) and the incidents if ``signature`` moved;
    ``scope``: of the run it follows (``None``: the whole job)."""
    scope = scope or Follow(None, True, None)
    events: list[tuple[str, dict[str, Any]]] = []
    with session_scope(factory) as session:
        current = current_step(session, job_id, scope.rows) if scope.live else None
        if current is not None and current > after_step:
            rank = lowest_rank(session, job_id, scope.rows)
            rows = session.execute(
                select(StepRecord.step, func.max(StepRecord.duration_s))
                .where(
                    StepRecord.job_id == job_id,
                    StepRecord.rank == rank,
                    StepRecord.step > after_step,
                    StepRecord.step <= current,  # an earlier, longer run's are not news
                    *only(scope.rows, StepRecord.attempt),
                )
                .group_by(StepRecord.step)
                .order_by(StepRecord.step)
                .limit(MAX_POINTS)
            ).all()
            events.append(
                (
                    "steps",
                    {
                        "current_step": current,
                        "step": [int(s) for s, _ in rows],
                        "step_time": [num(v) for _, v in rows],
                    },
                )
            )
        now = incident_signature(session, job_id)
        if now != signature:
            incidents = incident_marks(
                session=session, job_id=job_id, limit=50, run=scope.incidents_of
            )
            events.append(("incidents", {"signature": now, "incidents": incidents}))
    return events


def format_event(name: str, payload: dict[str, Any], event_id: str | None = None) -> str:
    lines = [f"event: {name}"]
    if event_id is not None:
        lines.append(f"id: {event_id}")
    lines.append("data: " + json.dumps(payload, separators=(",", ":")))
    return "\n".join(lines) + "\n\n"


async def job_events(
    factory: sessionmaker[Session],
    job_id: int,
    *,
    after_step: int,
    signature: str,
    is_disconnected: Callable[[], Awaitable[bool]],
    poll_s: float = POLL_S,
    heartbeat_s: float = HEARTBEAT_S,
    max_s: float = MAX_STREAM_S,
    scope: Follow | None = None,
) -> AsyncIterator[str]:
    """Yield SSE text until the client disconnects or ``max_s`` passes; ``scope``: the
    run followed (:func:`follow`; ``None``: the whole job)."""
    started = last_sent = time.monotonic()
    yield "retry: 3000\n\n"
    while not await is_disconnected():
        events = await anyio.to_thread.run_sync(
            snapshot, factory, job_id, after_step, signature, scope
        )
        for name, payload in events:
            if name == "steps":
                steps = payload["step"]
                after_step = max([payload["current_step"], *steps])
            else:
                signature = payload["signature"]
            yield format_event(name, payload, f"{after_step}|{signature}")
            last_sent = time.monotonic()
        now = time.monotonic()
        if now - started >= max_s:
            return
        if now - last_sent >= heartbeat_s:
            yield ": ping\n\n"
            last_sent = now
        await anyio.sleep(poll_s)


def resume_point(request: Request, after_step: int, signature: str) -> tuple[int, str]:
    """Where a reconnecting EventSource left off (``Last-Event-ID``), else the query's."""
    last = request.headers.get("last-event-id", "")
    step, sep, sig = last.partition("|")
    if sep and step.lstrip("-").isdigit():
        return int(step), sig
    return after_step, signature


@router.get("/ui/jobs/{job}/stream")
async def job_stream(
    job: str,
    request: Request,
    _: ReadApi,
    after_step: Annotated[int, Query()] = -1,
    incidents: Annotated[str, Query(max_length=200)] = "",
    run: RunQuery = None,
    all_incidents: bool = False,
) -> StreamingResponse:
    """Server-Sent Events: ``steps`` and ``incidents`` as the job changes; those of run
    ``run`` (default: the job's current run; ``all_incidents``: every run's incidents)."""
    factory: sessionmaker[Session] = request.app.state.sessionmaker

    def find() -> tuple[int, Follow] | None:
        with session_scope(factory) as session:
            job_id = get_job_id(session=session, name=job)
            if job_id is None:
                return None
            scope = follow(session, job_id=job_id, job=job, run=run, every_run=all_incidents)
            return job_id, scope

    found = await anyio.to_thread.run_sync(find)
    if found is None:
        raise HTTPException(404, f"job {job!r} not found")
    job_id, scope = found
    after, sig = resume_point(request, after_step, incidents)
    slots: StreamSlots = request.app.state.stream_slots
    key = stream_key(request)
    refused = slots.acquire(key)
    if refused is not None:
        settings: Settings = request.app.state.settings
        why = (
            f"this token has {slots.per_key} live streams open already"
            if refused == 429
            else f"the server has {slots.total} live streams open"
        )
        raise HTTPException(
            refused,
            f"{why}; close one or retry later",
            headers={"Retry-After": str(settings.retry_after_s)},
        )
    events = job_events(
        factory,
        job_id,
        after_step=after,
        signature=sig,
        is_disconnected=request.is_disconnected,
        scope=scope,
    )
    return SlotStream(events, release=lambda: slots.release(key))
