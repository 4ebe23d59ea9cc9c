"""Heartbeats of a 16k-rank job: each one an SQL upsert of its rank's row, or kept in Redis
(``backend.telemetry.liveness``) with the row refreshed every ``SQL_REFRESH_S``.

This is a benchmark, not a test: it prints figures and asserts nothing. It talks only to
a PostgreSQL and a Redis on loopback, creates its own jobs, and takes a minute or two.

    .venv/bin/python bench/liveness.py \\
        --database-url postgresql+psycopg://postgres@127.0.0.1:5432/vigil_bench \\
        --redis-url redis://127.0.0.1:6379/4

For each path (``VIGIL_LIVENESS_STORE=sql``, then ``redis``) it makes a job of ``--ranks``
ranks that have each sent a first batch (the rows and the Redis state exist), then sends
``--rounds`` heartbeats a second per rank from ``--timed-ranks`` of them, on a simulated
clock (so ``SQL_REFRESH_S`` counts simulated seconds: the share of heartbeats that write
SQL is what a live job's would be, however fast this machine is). Each heartbeat is one
heartbeat-only batch, stored as the API stores it: ``ingest_batch`` in its own
transaction (the batch is parsed before the clock starts). It then times the rank-state
write alone (``record_rank`` + commit), and the sweep's reads of the whole job.

Figures per 1,000 heartbeats: wall ms, this process's CPU ms, SQL statements (all, and
those writing ``ranks``), Redis round trips.
"""

from __future__ import annotations

import argparse
import ipaddress
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlsplit

import orjson
from sqlalchemy import Engine, event, select
from sqlalchemy.orm import Session, sessionmaker

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from backend.celery_app import configure
from backend.db import make_engine, make_sessionmaker, session_scope
from backend.detection.window import load_liveness
from backend.ingest.schemas import IngestBatch
from backend.ingest.service import ingest_batch
from backend.jobs.models import Job
from backend.jobs.rank_state import from_epoch, rank_values, upsert_ranks
from backend.jobs.runs import run_ranks
from backend.migrate import upgrade
from backend.settings import Settings
from backend.telemetry import liveness


class Clock:
    """The simulated server clock ``backend.telemetry.liveness`` reads."""

    def __init__(self) -> None:
        self.now = time.time()

    def install(self) -> None:
        liveness.time = SimpleNamespace(time=lambda: self.now, monotonic=time.monotonic)  # type: ignore[assignment]


class Counts:
    """SQL statements (all; writing ``ranks``) and Redis round trips, from now on."""

    def __init__(self, engine: Engine) -> None:
        self.c: Counter[str] = Counter()
        event.listen(engine, "before_cursor_execute", self._sql)
        for name in ("record", "confirm", "states"):
            original = getattr(liveness.LivenessStore, name)
            setattr(liveness.LivenessStore, name, self._counted(name, original))

    def _sql(self, conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        self.c["sql"] += 1
        if statement.lstrip().upper().startswith("INSERT INTO RANKS"):
            self.c["rank_writes"] += 1

    def _counted(self, name: str, original: Any) -> Any:
        def wrapper(store: Any, *args: Any, **kwargs: Any) -> Any:
            self.c["redis"] += 1  # each is one round trip (confirm: one pipeline)
            return original(store, *args, **kwargs)

        return wrapper

    def take(self) -> Counter[str]:
        out, self.c = self.c, Counter()
        return out


def heartbeat(job: str, rank: int, ts: float, step: int) -> IngestBatch:
    inflight = {"group": "dp", "op": "all_reduce", "seq": step * 8, "since": ts - 0.2}
    return IngestBatch.model_validate(
        {
            "batch_id": str(uuid.uuid4()),
            "job": job,
            "kind": "training",
            "rank": rank,
            "world_size": 16384,
            "host": f"node-{rank // 8}",
            "attempt": 0,
            "events": [
                {
                    "type": "heartbeat",
                    "ts": ts,
                    "step": step,
                    "pid": 1000 + rank,
                    "inflight": inflight,
                    "mem_capacity": 80 * 2**30,
                }
            ],
        }
    )


def setup(factory: sessionmaker[Session], clock: Clock, job: str, ranks: int) -> int:
    """Every rank has sent a first batch at the clock's time: rows (and Redis state)."""
    with session_scope(factory, write=True) as s:
        ingest_batch(session=s, batch=heartbeat(job, 0, clock.now, 1))
    with session_scope(factory) as s:
        job_id = s.scalar(select(Job.id).where(Job.name == job))
    assert job_id is not None
    rows = []
    for rank in range(1, ranks):
        beat = heartbeat(job, rank, clock.now, 1)
        values = rank_values(
            job_id=job_id, rank=rank, host=beat.host, attempt=0, by_type={"heartbeat": beat.events}
        )
        rows.append({**values, "last_seen_at": from_epoch(clock.now)})
    with session_scope(factory, write=True) as s:
        for i in range(0, len(rows), 2000):
            upsert_ranks(s, rows[i : i + 2000])
    store = liveness.store()
    if store is not None:
        synced = []
        for values in rows:
            _, row = store.record(values, now=clock.now)
            assert row is not None
            synced.append(liveness.Synced(job_id, row["rank"], row["_seen"], row["_sig"]))
        store.confirm(synced)
    return job_id


def timed(label: str, counts: Counts, n: int, run: Any) -> dict[str, Any]:
    counts.take()
    wall, cpu = time.perf_counter(), time.process_time()
    run()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    c = counts.take()
    per = 1000 / n
    return {
        "label": label,
        "heartbeats": n,
        "wall_ms_per_1000": round(wall * 1000 * per, 1),
        "cpu_ms_per_1000": round(cpu * 1000 * per, 1),
        "sql_per_1000": round(c["sql"] * per, 1),
        "rank_writes_per_1000": round(c["rank_writes"] * per, 1),
        "redis_per_1000": round(c["redis"] * per, 1),
    }


def bench_path(
    path: str, args: argparse.Namespace, factory: sessionmaker[Session], counts: Counts
) -> list[dict[str, Any]]:
    clock = Clock()
    clock.install()
    settings = Settings(
        database_url=args.database_url,
        redis_url=args.redis_url,
        liveness_store=path,
        detect_interval_s=0,
    )
    configure(settings, factory)
    job = f"bench-liveness-{path}-{uuid.uuid4().hex[:6]}"
    job_id = setup(factory, clock, job, args.ranks)
    t0, ranks, rounds = clock.now, range(args.timed_ranks), args.rounds
    # Rank r beats at t0 + k + r / n in round k: a second apart, phases spread out.
    batches = [
        [heartbeat(job, r, t0 + k + r / len(ranks), k + 1) for r in ranks]
        for k in range(1, rounds + 1)
    ]

    def batches_through_ingest() -> None:
        for k, round_ in enumerate(batches, start=1):
            for r, batch in zip(ranks, round_, strict=True):
                clock.now = t0 + k + r / len(ranks)
                with session_scope(factory, write=True) as s:
                    ingest_batch(session=s, batch=batch)

    def rank_state_only() -> None:
        for k in range(rounds + 1, 2 * rounds + 1):
            for r in ranks:
                clock.now = t0 + k + r / len(ranks)
                beat = heartbeat(job, r, clock.now, k + 1)
                values = rank_values(
                    job_id=job_id,
                    rank=r,
                    host=beat.host,
                    attempt=0,
                    by_type={"heartbeat": beat.events},
                )
                with session_scope(factory, write=True) as s:
                    liveness.record_rank(session=s, values=values)

    n = rounds * len(ranks)
    out = [
        timed(f"{path}: heartbeat batches (ingest_batch)", counts, n, batches_through_ingest),
        timed(f"{path}: rank state only (record_rank)", counts, n, rank_state_only),
    ]
    for r in ranks:  # one more heartbeat (news SQL lacks), then the timed ranks fall silent
        clock.now = t0 + 2 * rounds + 1 + r / len(ranks)
        values = rank_values(
            job_id=job_id,
            rank=r,
            host=f"node-{r // 8}",
            attempt=0,
            by_type={"heartbeat": heartbeat(job, r, clock.now, 2 * rounds + 2).events},
        )
        with session_scope(factory, write=True) as s:
            liveness.record_rank(session=s, values=values)
    clock.now += liveness.QUIET_S + 1

    def sweep_reads() -> None:
        with session_scope(factory, write=True) as s:
            flushed = liveness.flush_quiet(session=s, job_id=job_id, now=clock.now)
        with session_scope(factory) as s:
            load_liveness(session=s, job_id=job_id, now=clock.now)
        print(f"  {path}: the sweep flushed {flushed} silent ranks' state to SQL")

    sweep = timed(f"{path}: one sweep of the job (flush + load_liveness)", counts, 1, sweep_reads)
    with session_scope(factory) as s:
        started = time.perf_counter()
        rows = run_ranks(session=s, job_id=job_id)
        sql_ms = (time.perf_counter() - started) * 1000
        started = time.perf_counter()
        liveness.overlay(rows, job_id=job_id)
        overlay_ms = (time.perf_counter() - started) * 1000
    sweep["sweep_ms"] = round(sweep["wall_ms_per_1000"] / 1000, 1)
    sweep["rank_rows_ms"], sweep["overlay_ms"] = round(sql_ms, 1), round(overlay_ms, 1)
    return [*out, sweep]


def require_loopback(url: str, what: str) -> None:
    host = urlsplit(url).hostname or ""
    try:
        ok = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        ok = False
    if not ok:
        sys.exit(f"{what}: only a loopback host is allowed, not {host!r}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", required=True, help="PostgreSQL (migrated here)")
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--ranks", type=int, default=16384, help="ranks of the job")
    parser.add_argument("--timed-ranks", type=int, default=512, help="ranks that beat")
    parser.add_argument("--rounds", type=int, default=20, help="heartbeats per timed rank")
    parser.add_argument("--json", action="store_true", help="one JSON line per figure")
    args = parser.parse_args()
    require_loopback(args.database_url, "--database-url")
    require_loopback(args.redis_url, "--redis-url")
    if not 1 <= args.timed_ranks <= args.ranks <= 200_000:
        sys.exit("need 1 <= --timed-ranks <= --ranks <= 200000")
    upgrade(args.database_url)
    engine = make_engine(args.database_url)
    factory = make_sessionmaker(engine)
    counts = Counts(engine)
    results = []
    for path in ("sql", "redis"):
        results += bench_path(path, args, factory, counts)
    configure(Settings(database_url=args.database_url))
    print(f"\n{args.ranks} ranks, {args.timed_ranks} beating x {args.rounds} rounds")
    head = ("what", "wall ms", "cpu ms", "sql", "ranks writes", "redis")
    print("per 1,000 heartbeats: " + " | ".join(head[1:]))
    for r in results:
        line = (
            f"{r['label']:<58} {r['wall_ms_per_1000']:>9} {r['cpu_ms_per_1000']:>8} "
            f"{r['sql_per_1000']:>7} {r['rank_writes_per_1000']:>7} {r['redis_per_1000']:>6}"
        )
        if "sweep_ms" in r:
            line = (
                f"{r['label']:<58} {r['sweep_ms']:>7} ms (rank rows {r['rank_rows_ms']} ms, "
                f"+ Redis overlay {r['overlay_ms']} ms); {r['sql_per_1000'] / 1000:.0f} SQL "
                f"statements, {r['redis_per_1000'] / 1000:.0f} Redis reads"
            )
        print(line)
        if args.json:
            print(orjson.dumps(r).decode())
    engine.dispose()


if __name__ == "__main__":
    main()
