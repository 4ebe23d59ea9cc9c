"""Direct mode (the default): every rank ships its own ``POST /api/v1/ingest`` each flush,
as a collector without a relay does (``collector.shipper``'s rules):

- every ``flush_s`` (at the rank's own phase) one batch: the steps and collective
  aggregates that ended since its last batch, plus its newest heartbeat;
- a batch that gets no 200 is kept and resent with the same ``batch_id`` and body after
  the server's ``Retry-After`` (429) or a backoff; its heartbeat goes again alone at once,
  and until the batch is through each tick's heartbeat goes alone, so liveness does not
  queue behind telemetry (a heartbeat-only request that fails is superseded by the next
  one, not retried);
- a crashed rank stops at once; at the end it sends what is left and a goodbye.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

import orjson

from bench.loadgen.http import TransportError

if TYPE_CHECKING:
    from bench.loadgen.generator import LoadRun, _Rank
    from bench.loadgen.job import Event


async def rank_loop(run: LoadRun, r: _Rank) -> None:
    sim = run.sims[r.job]
    tick = run.start + run.rng.uniform(0, run.opts.flush_s)
    while True:
        await asyncio.sleep(max(0.0, tick - time.time()))
        now = time.time()
        tick = max(tick + run.opts.flush_s, now)
        if sim.crashed(r.rank):
            r.pending, r.done = None, True
            return
        beat = sim.heartbeat(r.rank, now)
        last = run.draining and r.pending is None and r.cursor >= sim.completed
        if last and beat is not None and run.opts.goodbye:
            beat = {**beat, "exiting": True, "exit_code": 0}
        if r.pending is None:  # a fresh batch: the heartbeat rides along
            r.pending = run._take(r, beat)
            await _send_pending(run, r)
            if r.pending is not None and beat is not None:
                await _send_beat(run, r, beat)  # it failed: the heartbeat again, alone
        else:  # telemetry waits: the heartbeat goes alone, the batch when it is due
            if beat is not None:
                await _send_beat(run, r, beat)
            if time.time() >= r.pending.retry_at:
                await _send_pending(run, r)
        if last and r.pending is None:
            r.done = True
            return


async def _post(run: LoadRun, r: _Rank, body: bytes, gz: bool) -> tuple[int, float, Any]:
    """(status or 0 for a transport error, seconds, reply JSON or Retry-After)."""
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {run.opts.token}"}
    if gz:
        headers["Content-Encoding"] = "gzip"
    run.stats.post()
    try:
        reply = await r.client.post("/api/v1/ingest", body, headers)
    except TransportError as exc:
        return 0, 0.0, str(exc)
    took = reply.seconds
    if reply.status == 200:
        return 200, took, orjson.loads(reply.body)
    if reply.status == 429:
        return 429, took, float(reply.headers.get("retry-after") or 1.0)
    return reply.status, took, reply.body.decode(errors="replace")


async def _send_pending(run: LoadRun, r: _Rank) -> None:
    assert r.pending is not None
    status, took, got = await _post(run, r, r.pending.body, r.pending.gzipped)
    run._settle(r, status, took, got)


async def _send_beat(run: LoadRun, r: _Rank, beat: Event) -> None:
    body, gz = run._batch(r, [beat])
    status, took, got = await _post(run, r, body, gz)
    if status == 200:
        run.stats.ok(steps=0, collectives=0, rtt_s=took, actions=len(got.get("actions") or []))
    else:
        run._failed(status, got, heartbeat_only=True)
