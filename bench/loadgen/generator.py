"""The load run: ``jobs`` × ``ranks`` simulated ranks shipping to Vigil over the real ingest
contract, as the collector does, while faults are injected and incidents watched.

    summary = asyncio.run(run(Options(endpoints=["http://127.0.0.1:8000"], token="…",
                                      ranks=512, duration_s=60, faults=parse_faults("…"))))

Each rank behaves like a collector's shipping thread: every ``flush_s`` (at its own
random phase) one batch of the steps and collective aggregates that ended since its last,
plus its newest heartbeat (``bench.loadgen.job`` says what they hold); a batch without a
200 is kept and resent with the same ``batch_id`` after ``Retry-After`` or a backoff (0.5 s
doubling to 4 s) while its heartbeats go alone; its buffer is bounded (``max_queue``
events: past it the oldest steps are dropped and counted); a batch holds at most
``max_batch`` events; a crashed rank stops at once; at the end each sends what is left and
a goodbye heartbeat (``exiting``, exit code 0). How the batches travel:

- ``bench.loadgen.direct`` (default): each rank its own ``POST /api/v1/ingest``, bodies
  over 1 KiB gzipped;
- ``bench.loadgen.node`` (``relay``): the ranks of a node in one
  ``POST /api/v1/ingest/multi`` per flush, as the per-host relay sends them.

Before the first step, ``warmup_s`` of heartbeats only: the ranks initialising (the
collector heartbeats from ``init()``), which also creates the job's rows and warms the
servers before step traffic starts. Fault times and the run's length count from the first
step.

Ranks are spread over the ``endpoints`` (API replicas behind a load balancer), one
keep-alive connection pool per endpoint. The run lasts ``duration_s``; then, while a fault
is not yet found and its bound not passed, it goes on (at most ``settle_s``), and then
drains (at most ``drain_s``). The summary says what was offered, acknowledged, stored,
dropped, which faults were found, how fast and with which ranks
(``bench.loadgen.report.judge``).
"""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from bench.loadgen.direct import rank_loop
from bench.loadgen.faults import bound_s
from bench.loadgen.http import Pool
from bench.loadgen.job import Event, Shape, SimJob
from bench.loadgen.node import node_loop
from bench.loadgen.options import Options
from bench.loadgen.probes import CpuProbe, DbProbe, RestProbe
from bench.loadgen.report import Stats, format_row, header, judge, lost, row, totals

GZIP_ABOVE = 1024  # as the collector
BACKOFF_S = (0.5, 4.0)


@dataclass
class _Pending:
    body: bytes
    gzipped: bool
    steps: int
    collectives: int
    ends: list[float]  # the carried steps' end times, for the delivery latency
    retry_at: float = 0.0
    failures: int = 0


@dataclass
class _Rank:
    job: int
    rank: int
    client: Pool
    cursor: int = 0  # the next step to ship
    pending: _Pending | None = None
    done: bool = False


class LoadRun:
    """One run; :meth:`main` returns the summary dict."""

    def __init__(self, opts: Options, *, out: Callable[[str], None] = print) -> None:
        self.opts, self.out = opts, out
        self.rng = random.Random(opts.seed)
        self.start = time.time() + 0.5
        self.t0 = self.start + opts.warmup_s  # the first step starts; fault times count from here
        self.names = [f"{opts.job_prefix}-{j}" for j in range(opts.jobs)]
        shape = Shape(
            ranks=opts.ranks,
            tp=opts.tp,
            step_s=opts.step_s,
            seed=opts.seed,
            ranks_per_node=opts.ranks_per_node,
        )
        self.sims = [
            SimJob(shape, t0=self.t0, faults=[f for f in opts.faults if f.job == j])
            for j in range(opts.jobs)
        ]
        self.per_step = 1 + shape.collectives_per_step  # telemetry events per rank-step
        self.stats = Stats(self.start)
        self.cpu = CpuProbe(opts.cpu)
        self.draining = False
        self.incidents: dict[int, list[dict[str, Any]]] = {}
        self.rows: list[dict[str, Any]] = []
        self._offered_upto = [0] * opts.jobs
        self._stored_before = 0

    # -- the ranks ---------------------------------------------------------------------

    def _batch(self, r: _Rank, events: list[Event], *, gzip_ok: bool = True) -> tuple[bytes, bool]:
        body = {
            "batch_id": os.urandom(16).hex(),
            "job": self.names[r.job],
            "kind": "training",
            "rank": r.rank,
            "world_size": self.opts.ranks,
            "host": self.sims[r.job].shape.host(r.rank),
            "attempt": 0,
            "events": events,
        }
        if any(e.get("loss") != e.get("loss") for e in events if e["type"] == "step"):
            raw = json.dumps(body, separators=(",", ":")).encode()  # NaN: orjson writes null
        else:
            raw = orjson.dumps(body)
        if gzip_ok and len(raw) > GZIP_ABOVE:
            return gzip.compress(raw, compresslevel=1), True
        return raw, False

    def _take(self, r: _Rank, beat: Event | None, *, gzip_ok: bool = True) -> _Pending:
        """The rank's next batch: its backlog of ended steps (oldest dropped past
        ``max_queue``) and its heartbeat."""
        sim = self.sims[r.job]
        backlog = sim.completed - r.cursor
        cap = max(1, self.opts.max_queue // self.per_step)
        if backlog > cap:
            self.stats.drop((backlog - cap) * self.per_step)
            r.cursor += backlog - cap
        upto = min(sim.completed, r.cursor + max(1, (self.opts.max_batch - 1) // self.per_step))
        events: list[Event] = []
        ends = []
        for step in range(r.cursor, upto):
            got = sim.events(r.rank, step)
            ends.append(got[0]["ts"])
            events += got
        n_steps = upto - r.cursor
        r.cursor = upto
        if beat is not None:
            events.append(beat)
        body, gz = self._batch(r, events, gzip_ok=gzip_ok)
        return _Pending(body, gz, n_steps, len(events) - n_steps - int(beat is not None), ends)

    def _settle(self, r: _Rank, status: int, took: float, got: Any) -> None:
        """The rank's pending batch got ``status`` (0: no answer): acknowledged, refused
        for good, or kept for a retry after ``Retry-After`` (``got``, 429) or a backoff."""
        p = r.pending
        assert p is not None
        if status == 200:
            now = time.time()
            self.stats.ok(
                steps=p.steps,
                collectives=p.collectives,
                rtt_s=took,
                delivery_s=[now - end for end in p.ends],
                actions=len(got.get("actions") or []),
            )
            r.pending = None
            return
        self._failed(status, got)
        if 400 <= status < 500 and status != 429:
            r.pending = None  # refused for good: our bug, counted and shown in the summary
            return
        p.failures += 1
        wait = got if status == 429 else self._backoff(p.failures)
        p.retry_at = time.time() + wait

    def _backoff(self, failures: int) -> float:
        base, cap = BACKOFF_S
        return self.rng.uniform(base / 2, min(cap, base * 2 ** (failures - 1)))

    def _failed(self, status: int, got: Any, *, heartbeat_only: bool = False) -> None:
        what = {0: "transport_errors", 429: "throttled"}.get(status)
        if what is None:
            what = "server_errors" if status >= 500 else "rejected"
        self.stats.failed(what, heartbeat_only=heartbeat_only, message=f"{status}: {got}")

    # -- the clock, the watchers ------------------------------------------------------

    async def _clock(self) -> None:
        """End the jobs' steps as time passes; count what the live ranks produce; note how
        late the event loop wakes up (a generator short of CPU would delay heartbeats)."""
        tick = 0.05
        while not self.draining:
            now = time.time()
            for j, sim in enumerate(self.sims):
                done = sim.advance(now)
                alive = self.opts.ranks - (len(sim.stall.crashed) if sim.stall else 0)
                self.stats.offer((done - self._offered_upto[j]) * alive * self.per_step)
                self._offered_upto[j] = done
            before = time.perf_counter()
            await asyncio.sleep(tick)
            late = time.perf_counter() - before - tick
            self.stats.window.loop_lag_s = max(self.stats.window.loop_lag_s, late)

    async def _poll(self, rest: RestProbe) -> None:
        while True:
            for j, name in enumerate(self.names):
                got = await rest.incidents(name)
                if got is not None:
                    self.incidents[j] = got
            await asyncio.sleep(self.opts.poll_s)

    def _verdict(self) -> dict[str, Any]:
        return judge(self.opts.faults, self.incidents, t0=self.t0, step_s=self.opts.step_s)

    def _settled(self, now: float) -> bool:
        """Every fault found, or past its bound (with a little slack)."""
        results = self._verdict()["faults"]
        return all(
            res["found"] or now > self.t0 + f.at_s + bound_s(f, step_s=self.opts.step_s) + 5
            for f, res in zip(self.opts.faults, results, strict=True)
        )

    async def _report(self, db: DbProbe | None, rest: RestProbe) -> None:
        now = time.time()
        window = self.stats.cut(now)
        cpu = self.cpu.interval(self.cpu.seconds())
        span = max(now - window.start, 1e-9)
        stored, size = await self._stored(db, rest)
        delta = None if stored is None else stored - self._stored_before
        self._stored_before = stored or 0
        got = row(
            window,
            end=now,
            t0=self.t0,
            stored=delta,
            cpu={k: v / span for k, v in cpu.items()},
            db_bytes=size,
        )
        self.rows.append(got)
        self.out(format_row(got))

    async def _stored(self, db: DbProbe | None, rest: RestProbe) -> tuple[int | None, int | None]:
        """Telemetry rows stored so far over all jobs (steps + collectives from the
        database; steps only over REST without one), and the database's size."""
        if db is not None:

            def count() -> tuple[int, int]:
                rows = [db.stored(n) for n in self.names]
                return sum(r["steps"] + r["collectives"] for r in rows), db.size()

            return await asyncio.to_thread(count)
        counts = [await rest.steps_stored(n) for n in self.names]
        return (None if None in counts else sum(c or 0 for c in counts)), None

    async def main(self) -> dict[str, Any]:
        o = self.opts
        clients = [Pool(e, size=o.connections, timeout_s=o.timeout_s) for e in o.endpoints]
        rest = RestProbe(o.endpoints[0], o.read_token or o.token)
        db = await asyncio.to_thread(DbProbe, o.database_url) if o.database_url else None
        db_before = await asyncio.to_thread(db.size) if db else None
        ranks = [
            _Rank(j, r, clients[(j * o.ranks + r) % len(clients)])
            for j in range(o.jobs)
            for r in range(o.ranks)
        ]
        self.cpu.interval(self.cpu.seconds())
        self.out(
            f"{o.jobs} job(s) × {o.ranks} ranks, step {o.step_s:g} s, flush {o.flush_s:g} s, "
            f"{len(o.endpoints)} endpoint(s), jobs {', '.join(self.names)}"
            + (f"; through a relay per node of {o.ranks_per_node} ranks" if o.relay else "")
        )
        for f in o.faults:
            self.out(f"  fault: {f.describe()}")
        if db is None:
            self.out("stored/s: step rows only, over REST (no --database-url)")
        self.out(header([*self.cpu.specs, "loadgen"]))
        tasks = [asyncio.create_task(self._clock()), asyncio.create_task(self._poll(rest))]
        if o.relay:  # one sender per node, as its relay
            nodes: dict[tuple[int, str], list[_Rank]] = {}
            for r in ranks:
                nodes.setdefault((r.job, self.sims[r.job].shape.host(r.rank)), []).append(r)
            senders = [
                asyncio.create_task(node_loop(self, members, clients[i % len(clients)]))
                for i, members in enumerate(nodes.values())
            ]
        else:
            senders = [asyncio.create_task(rank_loop(self, r)) for r in ranks]
        try:
            await asyncio.sleep(max(0.0, self.t0 - time.time()))
            if o.warmup_s > 0:
                await self._report(db, rest)  # the warm-up's row: t 0.0
            end = self.t0 + o.duration_s
            next_report = self.t0 + o.report_s
            while True:
                now = time.time()
                if now >= end and (self._settled(now) or now >= end + o.settle_s):
                    break
                if now >= next_report:
                    await self._report(db, rest)
                    next_report += o.report_s
                await asyncio.sleep(min(0.5, max(0.0, next_report - now)))
            ran_s = time.time() - self.t0
            self.draining = True
            _, late = await asyncio.wait(senders, timeout=o.drain_s)
            for t in late:
                t.cancel()
            await self._report(db, rest)
            for j, name in enumerate(self.names):  # the last word on incidents
                got = await rest.incidents(name)
                if got is not None:
                    self.incidents[j] = got
            return self._summary(ranks, db, db_before, ran_s)
        finally:
            for t in tasks + senders:
                t.cancel()
            await asyncio.gather(*tasks, *senders, return_exceptions=True)
            for c in clients:
                await c.close()
            await rest.close()
            if db is not None:
                db.close()

    def _summary(
        self,
        ranks: list[_Rank],
        db: DbProbe | None,
        db_before: int | None,
        ran_s: float,
    ) -> dict[str, Any]:
        o, t = self.opts, self.stats.total
        unsent = sum(
            (self.sims[r.job].completed - r.cursor) * self.per_step
            + (r.pending.steps + r.pending.collectives if r.pending else 0)
            for r in ranks
            if not r.done and not self.sims[r.job].crashed(r.rank)
        )
        stored: dict[str, Any] = {}
        if db is not None:
            per_job = {n: db.stored(n, duplicates=True) for n in self.names}
            stored = {
                "steps": sum(v["steps"] for v in per_job.values()),
                "collectives": sum(v["collectives"] for v in per_job.values()),
                "duplicate_steps": sum(v["duplicate_steps"] for v in per_job.values()),
                "db_growth_mb": round((db.size() - (db_before or 0)) / 2**20, 1),
            }
        self.cpu.interval(self.cpu.seconds())
        return {
            "config": {
                "endpoints": o.endpoints,
                "jobs": self.names,
                "ranks": o.ranks,
                "step_s": o.step_s,
                "tp": o.tp,
                "relay": o.relay,
                "ranks_per_node": o.ranks_per_node,
                "flush_s": o.flush_s,
                "duration_s": o.duration_s,
                "t0": self.t0,
                "ran_s": round(ran_s, 1),
            },
            "totals": totals(self.stats, unsent_at_end=unsent),
            "stored": stored,
            "lost": lost(t, stored),
            "cpu_seconds": {k: round(v, 1) for k, v in self.cpu.total.items()},
            "intervals": self.rows,
            "detection": self._verdict(),
        }


async def run(opts: Options, *, out: Callable[[str], None] = print) -> dict[str, Any]:
    return await LoadRun(opts, out=out).main()
