"""Ingest throughput benchmark: step events through ``POST /api/v1/ingest``, and optionally
the same rows loaded straight into PostgreSQL with ``COPY`` as the ceiling to compare with.

This is a benchmark, not a test: it prints figures and asserts nothing. It talks only to
127.0.0.1 (the endpoint and the COPY DSN are refused otherwise) and is bounded in count
(``--events`` at most 10 million) and in time (``--timeout``, default 600 s).

Start a server first (PostgreSQL shown; for SQLite use ``sqlite:////tmp/bench.db``)::

    export VIGIL_DATABASE_URL=postgresql+psycopg://postgres@127.0.0.1:5432/vigil_bench
    .venv/bin/vigil migrate
    .venv/bin/vigil server --port 8200

Then, from the repository root::

    # 200,000 step events, 1,000 per batch, 4 concurrent senders, 16 ranks
    .venv/bin/python bench/ingest.py --endpoint http://127.0.0.1:8200

    # bigger batches, gzip, 8 senders, and the COPY ceiling on the same rows
    .venv/bin/python bench/ingest.py --endpoint http://127.0.0.1:8200 --batch 5000 \\
        --concurrency 8 --gzip --copy-dsn postgresql://postgres@127.0.0.1:5432/vigil_bench

    # one machine-readable summary line at the end
    .venv/bin/python bench/ingest.py --endpoint http://127.0.0.1:8200 --events 20000 --json

Every request body is built and encoded (orjson, then gzip with ``--gzip``) before the
clock starts; the encoding time is printed separately. The client shares the machine with
the server, so its own CPU time is printed too.
"""

from __future__ import annotations

import argparse
import gzip
import ipaddress
import itertools
import math
import os
import random
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

import httpx
import orjson

MAX_EVENTS = 10_000_000
MAX_RETRIES = 50  # per batch, for 429 replies and dropped connections
MAX_RETRY_SLEEP_S = 2.0
LOCAL_HOSTS = {"localhost", ""}  # "" is a Unix-socket DSN (host omitted)
STEP_COLUMNS = (
    "job_id",
    "rank",
    "attempt",
    "step",
    "ts",
    "duration_s",
    "comm_s",
    "data_s",
    "loss",
    "grad_norm",
    "mem_bytes",
    "tokens",
    "opseq",
)


# --------------------------------------------------------------------------- workload


@dataclass(frozen=True)
class Batch:
    rank: int
    events: list[dict[str, Any]]
    body: bytes  # encoded (and compressed with --gzip), ready to send


def make_events(n: int, ranks: int, batch: int, seed: int = 0) -> list[tuple[int, list[dict]]]:
    """``n`` step events as ``(rank, events)`` batches, spread over ranks like a real job:
    batch ``i`` comes from rank ``i % ranks``, and each rank's steps are consecutive."""
    rng = random.Random(seed)
    t0 = 1_732_233_000.0
    next_step = [0] * ranks
    opseqs = [f"{rng.getrandbits(64):016x}" for _ in range(4)]
    out: list[tuple[int, list[dict]]] = []
    for i, start in enumerate(range(0, n, batch)):
        rank = i % ranks
        events = []
        for step in range(next_step[rank], next_step[rank] + min(batch, n - start)):
            duration = 0.31 + rng.gauss(0, 0.01) + (0.05 if rank == 7 else 0.0)
            events.append(
                {
                    "type": "step",
                    "step": step,
                    "ts": round(t0 + step * 0.31 + rank * 0.001, 3),
                    "duration_s": round(abs(duration), 5),
                    "comm_s": round(abs(rng.gauss(0.05, 0.005)), 5),
                    "data_s": round(abs(rng.gauss(0.01, 0.002)), 5),
                    "loss": round(2.5 * math.exp(-step / 50_000) + rng.gauss(0, 0.01), 5),
                    "grad_norm": round(abs(rng.gauss(1.0, 0.1)), 5),
                    "mem_bytes": 30_000_000_000 + rng.randrange(1_000_000),
                    "tokens": 524_288,
                    "opseq": opseqs[step // 10_000 % len(opseqs)],
                }
            )
        next_step[rank] += len(events)
        out.append((rank, events))
    return out


def encode_batches(
    batches: list[tuple[int, list[dict]]], *, job: str, ranks: int, use_gzip: bool
) -> list[Batch]:
    out = []
    for rank, events in batches:
        body = orjson.dumps(
            {
                "batch_id": str(uuid.uuid4()),
                "job": job,
                "kind": "training",
                "rank": rank,
                "world_size": ranks,
                "host": f"node-{rank // 8}",
                "attempt": 0,
                "events": events,
            }
        )
        if use_gzip:
            body = gzip.compress(body, compresslevel=6)
        out.append(Batch(rank, events, body))
    return out


# --------------------------------------------------------------------------- API run


@dataclass
class Tally:
    """What the senders saw. Guarded by ``lock``; latencies are per 200 reply."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    events: int = 0
    batches: int = 0
    errors: int = 0
    throttled: int = 0
    latencies: list[float] = field(default_factory=list)
    error_samples: list[str] = field(default_factory=list)

    def error(self, message: str) -> None:
        with self.lock:
            self.errors += 1
            if len(self.error_samples) < 5:
                self.error_samples.append(message)


def send_all(
    batches: list[Batch],
    *,
    endpoint: str,
    token: str,
    concurrency: int,
    use_gzip: bool,
    deadline: float,
    progress: bool,
) -> tuple[Tally, float]:
    """Send every batch with ``concurrency`` threads; returns the tally and elapsed seconds."""
    tally = Tally()
    next_index = itertools.count()  # next() on a count is atomic under the GIL
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    if use_gzip:
        headers["Content-Encoding"] = "gzip"

    def worker() -> None:
        with httpx.Client(base_url=endpoint, headers=headers, timeout=60.0) as client:
            while (i := next(next_index)) < len(batches) and time.monotonic() < deadline:
                send_one(client, batches[i], tally, deadline)

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(concurrency)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    last_print = started
    while any(t.is_alive() for t in threads):
        time.sleep(0.2)
        now = time.perf_counter()
        if progress and now - last_print >= 5.0:
            last_print = now
            with tally.lock:
                done = tally.events
            print(
                f"  … {done:,} events in {now - started:.0f} s ({done / (now - started):,.0f}/s)",
                file=sys.stderr,
            )
    return tally, time.perf_counter() - started


def send_one(client: httpx.Client, batch: Batch, tally: Tally, deadline: float) -> None:
    for _ in range(MAX_RETRIES):
        if time.monotonic() >= deadline:
            tally.error("deadline reached before the batch was stored")
            return
        t = time.perf_counter()
        try:
            reply = client.post("/api/v1/ingest", content=batch.body)
        except httpx.TransportError as exc:
            tally.error(f"{type(exc).__name__}: {exc}")
            time.sleep(0.1)
            continue
        latency = time.perf_counter() - t
        if reply.status_code == 200:
            with tally.lock:
                tally.events += len(batch.events)
                tally.batches += 1
                tally.latencies.append(latency)
            return
        if reply.status_code == 429:
            with tally.lock:
                tally.throttled += 1
            retry_after = float(reply.headers.get("retry-after", "1") or 1)
            time.sleep(min(retry_after, MAX_RETRY_SLEEP_S))
            continue
        tally.error(f"HTTP {reply.status_code}: {reply.text[:200]}")
        return
    tally.error(f"gave up after {MAX_RETRIES} tries")


def warm_up(endpoint: str, token: str, job: str, ranks: int, concurrency: int) -> None:
    """Open the server's DB connections and thread pool, untimed, on a separate job."""
    warm = make_events(concurrency * 10, ranks, 10, seed=1)
    batches = encode_batches(warm, job=f"{job}-warmup", ranks=ranks, use_gzip=False)
    tally, _ = send_all(
        batches,
        endpoint=endpoint,
        token=token,
        concurrency=concurrency,
        use_gzip=False,
        deadline=time.monotonic() + 60,
        progress=False,
    )
    if tally.errors:
        raise SystemExit(f"warm-up failed: {tally.error_samples[0]}")


# --------------------------------------------------------------------------- COPY run


def copy_load(
    dsn: str, job: str, ranks: int, batches: list[Batch]
) -> tuple[int, float, float, int]:
    """Load the same step rows with one ``COPY steps FROM STDIN`` into a new job row.

    Returns (rows, seconds, CPU seconds of the PostgreSQL backend that ran the COPY, rows
    the API run stored for ``job``). The clock covers turning the event dicts into rows,
    the COPY and the commit, like the server's own path does.
    """
    import psycopg

    with psycopg.connect(dsn) as conn:
        copy_job = f"{job}-copy-{uuid.uuid4().hex[:8]}"
        job_id = conn.execute(
            "INSERT INTO jobs (name, kind, world_size, attempt, created_at)"
            " VALUES (%s, 'training', %s, 0, %s) RETURNING id",
            (copy_job, ranks, datetime.now(UTC)),
        ).fetchone()[0]
        conn.commit()
        backend_pid = conn.info.backend_pid
        rows = 0
        cpu0 = process_cpu_s(backend_pid)
        started = time.perf_counter()
        sql = f"COPY steps ({', '.join(STEP_COLUMNS)}) FROM STDIN"
        with conn.cursor() as cur, cur.copy(sql) as copy:
            for batch in batches:
                for e in batch.events:
                    copy.write_row(
                        (
                            job_id,
                            batch.rank,
                            0,
                            e["step"],
                            e["ts"],
                            e["duration_s"],
                            e.get("comm_s"),
                            e.get("data_s"),
                            e.get("loss"),
                            e.get("grad_norm"),
                            e.get("mem_bytes"),
                            e.get("tokens"),
                            e.get("opseq"),
                        )
                    )
                    rows += 1
        conn.commit()
        seconds = time.perf_counter() - started
        backend_cpu = process_cpu_s(backend_pid) - cpu0  # nan when PostgreSQL is not local
        stored = conn.execute(
            "SELECT count(*) FROM steps JOIN jobs ON jobs.id = steps.job_id WHERE jobs.name = %s",
            (job,),
        ).fetchone()[0]
    return rows, seconds, backend_cpu, stored


# --------------------------------------------------------------------------- CPU accounting


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process and all its threads (Linux ``/proc``)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return math.nan
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def postgres_backends_cpu_s(dbname: str) -> float:
    """CPU seconds of the local PostgreSQL backends now connected to ``dbname``.

    Backends are found by their process title (``postgres: … <user> <dbname> …``); one
    that exits between two readings is lost, so read around work on pooled connections.
    """
    total = 0.0
    needle = f" {dbname} ".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                title = f.read()
        except OSError:
            continue
        if title.startswith(b"postgres:") and needle in title:
            total += process_cpu_s(int(entry))
    return total


# --------------------------------------------------------------------------- timed run


@dataclass
class ApiRun:
    """One timed run through the API, with the CPU the processes involved used during it
    (``nan`` where not measured)."""

    tally: Tally
    seconds: float
    client_cpu: float
    server_pid: int | None
    server_cpu: float
    pg_cpu: float

    @property
    def rate(self) -> float:
        """Events stored per second."""
        return self.tally.events / self.seconds if self.seconds > 0 else 0.0


def timed_send(
    batches: list[Batch],
    *,
    endpoint: str,
    token: str,
    concurrency: int,
    use_gzip: bool,
    timeout: float,
    server_pid: int | None,
    dbname: str | None,
) -> ApiRun:
    """``send_all`` on the clock, reading this process's CPU and, with ``server_pid``, the
    server's and (with ``dbname``) the local PostgreSQL backends' before and after."""
    server0 = process_cpu_s(server_pid) if server_pid else math.nan
    pg0 = postgres_backends_cpu_s(dbname) if server_pid and dbname else math.nan
    cpu0 = os.times()
    tally, seconds = send_all(
        batches,
        endpoint=endpoint,
        token=token,
        concurrency=concurrency,
        use_gzip=use_gzip,
        deadline=time.monotonic() + timeout,
        progress=True,
    )
    cpu1 = os.times()
    client_cpu = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
    server_cpu = process_cpu_s(server_pid) - server0 if server_pid else math.nan
    pg_cpu = postgres_backends_cpu_s(dbname) - pg0 if server_pid and dbname else math.nan
    return ApiRun(tally, seconds, client_cpu, server_pid, server_cpu, pg_cpu)


def report_api_run(run: ApiRun, noun: str = "event") -> dict[str, Any]:
    """Print what the API run achieved; returns the same as summary fields. ``noun`` names
    what a batch holds (``event``, ``request``) in the lines and the keys."""
    tally, seconds = run.tally, run.seconds
    lat = sorted(tally.latencies)
    summary: dict[str, Any] = {
        f"{noun}s": tally.events,
        "batches": tally.batches,
        "seconds": round(seconds, 3),
        f"{noun}s_per_s": round(run.rate),
        "p50_ms": round(percentile(lat, 50) * 1000, 1),
        "p99_ms": round(percentile(lat, 99) * 1000, 1),
        "errors": tally.errors,
        "throttled_429": tally.throttled,
        "client_cpu_s": round(run.client_cpu, 2),
    }
    print(
        f"api:     {tally.events:,} {noun}s in {tally.batches:,} batches, {seconds:.2f} s, "
        f"{run.rate:,.0f} {noun}s/s"
    )
    print(
        f"latency: p50 {summary['p50_ms']} ms, p99 {summary['p99_ms']} ms per batch "
        f"(max {lat[-1] * 1000 if lat else math.nan:.1f} ms)"
    )
    print(f"errors:  {tally.errors}, 429 replies: {tally.throttled}")
    for sample in tally.error_samples:
        print(f"  error: {sample}")
    print(f"client:  {run.client_cpu:.1f} s CPU ({run.client_cpu / seconds:.0%} of one core)")
    if run.server_pid and tally.events:
        per = 1e6 / tally.events
        line = f"server:  {run.server_cpu:.1f} s CPU, {run.server_cpu * per:.0f} µs/{noun}"
        if not math.isnan(run.pg_cpu):
            line += (
                f"; PostgreSQL backends {run.pg_cpu:.1f} s CPU, {run.pg_cpu * per:.0f} µs/{noun}"
            )
        print(line)
        summary |= {
            "server_cpu_s": round(run.server_cpu, 2),
            f"server_us_per_{noun}": round(run.server_cpu * per, 1),
        }
        if not math.isnan(run.pg_cpu):
            summary["pg_cpu_s"] = round(run.pg_cpu, 2)
            summary[f"pg_us_per_{noun}"] = round(run.pg_cpu * per, 1)
    return summary


# --------------------------------------------------------------------------- main


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an already sorted list (``nan`` when empty)."""
    if not sorted_values:
        return math.nan
    k = max(0, min(len(sorted_values) - 1, math.ceil(q / 100 * len(sorted_values)) - 1))
    return sorted_values[k]


def require_loopback(host: str | None, what: str) -> None:
    if host is None or host in LOCAL_HOSTS:
        return
    try:
        if ipaddress.ip_address(host).is_loopback:
            return
    except ValueError:
        pass
    raise SystemExit(f"{what}: only 127.0.0.1 is allowed, not {host!r}")


def copy_dbname(p: argparse.ArgumentParser, dsn: str | None) -> str | None:
    """The database a ``--copy-dsn`` names (``None`` without one); refuses a DSN that is
    not PostgreSQL's or not on loopback."""
    if not dsn:
        return None
    import psycopg.conninfo

    if not dsn.startswith(("postgresql://", "postgres://", "host=", "dbname=")):
        p.error("--copy-dsn must be a PostgreSQL DSN")
    conninfo = psycopg.conninfo.conninfo_to_dict(dsn)
    host = conninfo.get("host")
    require_loopback(str(host) if host is not None else None, "--copy-dsn")
    dbname = conninfo.get("dbname")
    return str(dbname) if dbname is not None else None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--endpoint", default="http://127.0.0.1:8000", help="server base URL")
    p.add_argument("--token", default="vigil-dev-ingest", help="ingest bearer token")
    p.add_argument("--events", type=int, default=200_000, help="step events to send")
    p.add_argument("--batch", type=int, default=1000, help="events per request")
    p.add_argument("--concurrency", type=int, default=4, help="concurrent senders (threads)")
    p.add_argument("--ranks", type=int, default=16, help="ranks the batches are spread over")
    p.add_argument("--gzip", action="store_true", help="send gzip-compressed bodies")
    p.add_argument("--copy-dsn", help="also COPY the same rows into this PostgreSQL database")
    p.add_argument("--job", help="job name (default: bench-<UTC time>)")
    p.add_argument(
        "--server-pid",
        type=int,
        help="report the CPU time of this server process (and, with --copy-dsn, of the "
        "PostgreSQL backends serving that database) during the API run; Linux only",
    )
    p.add_argument("--timeout", type=float, default=600.0, help="stop sending after this many s")
    p.add_argument("--no-warmup", action="store_true", help="skip the untimed warm-up batches")
    p.add_argument("--json", action="store_true", help="print a JSON summary line at the end")
    args = p.parse_args(argv)
    if not 1 <= args.events <= MAX_EVENTS:
        p.error(f"--events must be 1..{MAX_EVENTS:,}")
    if not 1 <= args.batch <= args.events:
        p.error("--batch must be 1..--events")
    if not 1 <= args.concurrency <= 64:
        p.error("--concurrency must be 1..64")
    if not 1 <= args.ranks <= 100_000:
        p.error("--ranks must be 1..100000")
    if not 0 < args.timeout <= 3600:
        p.error("--timeout must be in (0, 3600]")
    require_loopback(urlsplit(args.endpoint).hostname, "--endpoint")
    args.copy_dbname = copy_dbname(p, args.copy_dsn)
    args.job = args.job or f"bench-{datetime.now(UTC):%Y%m%dT%H%M%S}"
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    endpoint = args.endpoint.rstrip("/")

    t = time.perf_counter()
    raw = make_events(args.events, args.ranks, args.batch)
    batches = encode_batches(raw, job=args.job, ranks=args.ranks, use_gzip=args.gzip)
    encode_s = time.perf_counter() - t
    body_mb = sum(len(b.body) for b in batches) / 1e6
    print(
        f"job {args.job}: {args.events:,} step events in {len(batches):,} batches of "
        f"≤{args.batch:,}, {args.ranks} ranks, concurrency {args.concurrency}, "
        f"gzip {'on' if args.gzip else 'off'}; bodies {body_mb:.1f} MB, "
        f"built and encoded in {encode_s:.2f} s (not timed)"
    )

    if not args.no_warmup:
        warm_up(endpoint, args.token, args.job, args.ranks, args.concurrency)

    run = timed_send(
        batches,
        endpoint=endpoint,
        token=args.token,
        concurrency=args.concurrency,
        use_gzip=args.gzip,
        timeout=args.timeout,
        server_pid=args.server_pid,
        dbname=args.copy_dbname,
    )
    tally, api_rate = run.tally, run.rate
    summary: dict[str, Any] = {
        "job": args.job,
        "endpoint": endpoint,
        "batch": args.batch,
        "concurrency": args.concurrency,
        "ranks": args.ranks,
        "gzip": args.gzip,
    } | report_api_run(run)

    if args.copy_dsn:
        rows, copy_s, copy_cpu, stored = copy_load(args.copy_dsn, args.job, args.ranks, batches)
        copy_rate = rows / copy_s
        summary |= {
            "copy_rows": rows,
            "copy_seconds": round(copy_s, 3),
            "copy_rows_per_s": round(copy_rate),
            "api_copy_ratio": round(api_rate / copy_rate, 3),
            "api_rows_stored": stored,
            "copy_pg_us_per_row": round(copy_cpu * 1e6 / rows, 1),
        }
        print(
            f"copy:    {rows:,} rows in {copy_s:.2f} s, {copy_rate:,.0f} rows/s; "
            f"PostgreSQL backend {copy_cpu * 1e6 / rows:.0f} µs/row"
        )
        print(f"ratio:   API events/s ÷ COPY rows/s = {api_rate / copy_rate:.3f}")
        if stored != tally.events:
            print(f"warning: the database holds {stored:,} step rows for {args.job}")
    if args.json:
        print(orjson.dumps(summary).decode())
    return 1 if tally.errors else 0


if __name__ == "__main__":
    sys.exit(main())
