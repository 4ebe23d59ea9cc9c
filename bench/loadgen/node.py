"""Node mode (``--node-size K``): the ranks of a node ship through a per-host relay, so the
server gets one ``POST /api/v1/ingest/multi`` per node and flush, not one per rank.

The generator plays the relay's part itself (the real relay is ``collector.relay``; its own
tests and ``bench/relay.py`` show that it forwards batches unchanged): every ``flush_s``,
at the node's own phase, each rank of the node contributes what it would have sent alone
(``LoadRun._rank_loop``'s rules): a fresh batch with its heartbeat, or, while its batch
waits for a retry, its heartbeat alone and the batch again once due. As the relay sends
them (``collector.relay.buffer.lane_parts``), the heartbeat-only lines go first, in
requests of their own that the server's heartbeat lane takes when it refuses telemetry
(``collector.lane``), then the telemetry lines in one; a heartbeat that rode along with
refused telemetry goes again at once, alone, as a collector's does. Each request is
gzipped NDJSON; each line's result is handled as that rank's own reply. When the request
as a whole gets no results (no answer, a 5xx, a 429), every line gets its status.
Simulating 8,192 ranks one coroutine each, one request each per second, would cost this
generator more CPU than the server it measures; a node's coroutine costs about one.
"""

from __future__ import annotations

import asyncio
import gzip
import time
from typing import TYPE_CHECKING, Any

import orjson

from bench.loadgen.http import Pool, TransportError
from collector import lane

if TYPE_CHECKING:
    from bench.loadgen.generator import LoadRun, _Rank
    from bench.loadgen.job import Event

MULTI = "/api/v1/ingest/multi"

Line = tuple["_Rank", bool, bytes]  # (rank, heartbeat only, body)


async def node_loop(run: LoadRun, ranks: list[_Rank], client: Pool) -> None:
    """Ship for the node's ``ranks`` until each is done (drained and said goodbye) or
    crashed."""
    o = run.opts
    tick = run.start + run.rng.uniform(0, o.flush_s)
    live = list(ranks)
    while live:
        await asyncio.sleep(max(0.0, tick - time.time()))
        now = time.time()
        tick = max(tick + o.flush_s, now)
        beats: list[Line] = []  # heartbeat-only: ranks whose telemetry waits for a retry
        telemetry: list[Line] = []
        riders: list[tuple[_Rank, Event]] = []  # heartbeats riding along with fresh batches
        last: set[int] = set()
        for r in list(live):
            sim = run.sims[r.job]
            if sim.crashed(r.rank):
                r.pending, r.done = None, True
                live.remove(r)
                continue
            beat = sim.heartbeat(r.rank, now)
            if run.draining and r.pending is None and r.cursor >= sim.completed:
                last.add(id(r))
                if beat is not None and o.goodbye:
                    beat = {**beat, "exiting": True, "exit_code": 0}
            if r.pending is None:  # a fresh batch: the heartbeat rides along
                r.pending = run._take(r, beat, gzip_ok=False)
                telemetry.append((r, False, r.pending.body))
                if beat is not None:
                    riders.append((r, beat))
                continue
            if beat is not None:  # telemetry waits: the heartbeat goes alone
                beats.append(_alone(run, r, beat))
            if now >= r.pending.retry_at:
                telemetry.append((r, False, r.pending.body))
        await _send_beats(run, client, beats)
        if telemetry:
            await _send(run, client, telemetry)
            # Refused: the heartbeats that rode along go again, alone, at once (a collector's
            # probe, ``collector.shipper``; through the relay, in its next flush).
            again = [_alone(run, r, beat) for r, beat in riders if r.pending is not None]
            await _send_beats(run, client, again)
        for r in list(live):
            if id(r) in last and r.pending is None:
                r.done = True
                live.remove(r)


def _alone(run: LoadRun, r: _Rank, beat: Event) -> Line:
    return r, True, run._batch(r, [beat], gzip_ok=False)[0]


async def _send_beats(run: LoadRun, client: Pool, lines: list[Line]) -> None:
    """Heartbeat-only lines, in requests the server's heartbeat lane takes."""
    for part in lane.parts([len(body) for _, _, body in lines]):
        await _send(run, client, lines[part])


async def _send(run: LoadRun, client: Pool, lines: list[Line]) -> None:
    body = gzip.compress(b"\n".join(b for _, _, b in lines), compresslevel=1)
    headers = {
        "Content-Type": "application/x-ndjson",
        "Content-Encoding": "gzip",
        "Authorization": f"Bearer {run.opts.token}",
    }
    run.stats.post()
    try:
        reply = await client.post(MULTI, body, headers)
    except TransportError as exc:
        _each(run, lines, 0, 0.0, str(exc))
        return
    if reply.status == 429:
        _each(run, lines, 429, reply.seconds, float(reply.headers.get("retry-after") or 1.0))
        return
    if reply.status != 200:
        _each(run, lines, reply.status, reply.seconds, reply.body.decode(errors="replace"))
        return
    results = orjson.loads(reply.body)["results"]
    for (r, beat_only, _), res in zip(lines, results, strict=True):
        status = int(res["status"])
        got: Any = res
        if status == 429:
            got = float(res.get("retry_after") or 1.0)
        elif status != 200:
            got = f"{res.get('error')}: {res.get('detail')}"
        _one(run, r, beat_only, status, reply.seconds, got)


def _each(run: LoadRun, lines: list[Line], status: int, took: float, got: Any) -> None:
    for r, beat_only, _ in lines:
        _one(run, r, beat_only, status, took, got)


def _one(run: LoadRun, r: _Rank, beat_only: bool, status: int, took: float, got: Any) -> None:
    if not beat_only:
        run._settle(r, status, took, got)
    elif status == 200:
        run.stats.ok(steps=0, collectives=0, rtt_s=took, actions=len(got.get("actions") or []))
    else:
        run._failed(status, got, heartbeat_only=True)
