"""Serving ingest benchmark: ``request`` events with token times through
``POST /api/v1/ingest``, and optionally the same rows loaded straight into PostgreSQL with
``COPY`` as the ceiling to compare with.

Each request carries about ``--tokens`` output tokens' delivery times, encoded as the
collector encodes them (``collector.serving.encode_token_times``, the ``dv1`` format), plus
model, replica, queue time, prompt tokens and status. Batches come from ``--replicas``
replicas of one serving job (batch field ``kind: "serving"``), one replica per batch, as
each replica's collector would send them. ``--slos N`` defines N SLOs for the job first
(``POST /api/v1/slos``, admin token): ingest judges every request against each of them.

This is a benchmark, not a test: it prints figures and asserts nothing. Like
``bench/ingest.py``, whose sending, timing and CPU accounting it reuses, it talks only to
127.0.0.1 and is bounded in count (``--requests`` at most 10 million) and time
(``--timeout``, default 600 s).

Start a server first (see ``bench/ingest.py``)::

    export VIGIL_DATABASE_URL=postgresql+psycopg://postgres@127.0.0.1:5432/bench_requests
    .venv/bin/vigil migrate
    .venv/bin/vigil server --port 8200 &

Then, from the repository root::

    # 200,000 requests of ~200 tokens, 1,000 per batch, 4 senders, 4 replicas, no SLOs
    .venv/bin/python bench/ingest_requests.py --endpoint http://127.0.0.1:8200

    # with 3 SLOs, the server's CPU, and the COPY ceiling on the same rows
    .venv/bin/python bench/ingest_requests.py --endpoint http://127.0.0.1:8200 --slos 3 \\
        --server-pid $! --copy-dsn postgresql://postgres@127.0.0.1:5432/bench_requests --json

Every body is built and encoded before the clock starts; that time is printed separately.
"""

from __future__ import annotations

import argparse
import base64
import gzip
import math
import os
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import numpy as np
import orjson

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.ingest import (
    MAX_EVENTS,
    Batch,
    copy_dbname,
    process_cpu_s,
    report_api_run,
    require_loopback,
    send_all,
    timed_send,
)
from collector.serving import encode_token_times, recorded_indices, stride_for

T0 = 1_764_000_000.0  # 2025-11-24 16:00 UTC: when the simulated traffic starts (fixed)
MODEL = "llama-3.1-8b"
STATUSES = ("error", "aborted_by_client", "ok")
STATUS_CUTS = (0.01, 0.015)  # 1% error, 0.5% aborted by the client, the rest ok
# The ``requests`` columns in the order ingest writes them (``service._request_row``).
REQUEST_COLUMNS = (
    "job_id",
    "rank",
    "request_id",
    "arrival",
    "first_token",
    "end",
    "prompt_tokens",
    "output_tokens",
    "max_tbt_s",
    "status",
    "queue_s",
    "model",
    "replica",
    "token_stride",
    "token_deltas",
)
# SLO definitions ``--slos N`` cycles through (N > 4 repeats them under new names).
SLO_TEMPLATES: tuple[dict[str, float], ...] = (
    {"ttft_s": 0.5, "tpot_s": 0.05},
    {"e2e_s": 15.0},
    {"max_tbt_s": 0.25, "ttft_s": 1.0},
    {"tpot_s": 0.035},
)


# --------------------------------------------------------------------------- workload


def make_requests(
    n: int, *, tokens: int, replicas: int, batch: int, rate: float, seed: int = 0
) -> list[tuple[int, list[dict[str, Any]]]]:
    """``n`` request events as ``(replica, events)`` batches: batch ``i`` comes from replica
    ``i % replicas`` and holds that replica's next requests in arrival order.

    The fleet receives ``rate`` requests/s (Poisson), spread evenly over the replicas.
    Output lengths are uniform in ±25% of ``tokens``; token gaps are gamma-distributed
    around the replica's own time per output token (18–32 ms), with a rare 300 ms stall;
    about 1% of requests end in ``error`` and 0.5% are ``aborted_by_client``.
    """
    rng = np.random.default_rng(seed)
    tpot = 0.018 + 0.014 * rng.random(replicas)
    clock = np.full(replicas, T0)  # the next arrival time, per replica
    served = [0] * replicas
    lo, hi = max(1, math.ceil(tokens * 0.75)), max(1, math.floor(tokens * 1.25))
    out: list[tuple[int, list[dict[str, Any]]]] = []
    for i, start in enumerate(range(0, n, batch)):
        r, size = i % replicas, min(batch, n - start)
        arrival = clock[r] + np.cumsum(rng.exponential(replicas / rate, size))
        clock[r] = arrival[-1]
        prompt = np.minimum(rng.lognormal(6.0, 0.8, size).astype(int) + 1, 32_000)
        queue = rng.exponential(0.02, size)
        first = arrival + queue + 0.015 + prompt * 4e-5
        n_out = rng.integers(lo, hi + 1, size)
        gaps = rng.gamma(4.0, tpot[r] / 4.0, int(n_out.sum() - size))
        gaps[rng.random(gaps.size) < 2e-4] += 0.3
        cuts = np.cumsum(n_out - 1)[:-1]
        fate = rng.random(size)
        events = []
        for j, g in enumerate(np.split(gaps, cuts)):
            k = stride_for(int(n_out[j]))
            offsets = np.concatenate(([0.0], np.cumsum(g)))
            event: dict[str, Any] = {
                "type": "request",
                "id": f"pod-{r}-{served[r] + j}",
                "arrival": float(arrival[j]),
                "end": float(first[j] + offsets[-1] + 2e-4),
                "status": STATUSES[int(np.searchsorted(STATUS_CUTS, fate[j], side="right"))],
                "output_tokens": int(n_out[j]),
                "prompt_tokens": int(prompt[j]),
                "queue_s": float(queue[j]),
                "model": MODEL,
                "replica": f"pod-{r}",
                "first_token": float(first[j]),
            }
            if g.size:
                times = offsets[recorded_indices(int(n_out[j]), k)].tolist()
                event["max_tbt_s"] = float(g.max())
                event["token_times"] = {
                    "enc": "dv1",
                    "stride": k,
                    "data": encode_token_times(times),
                }
            events.append(event)
        served[r] += size
        out.append((r, events))
    return out


def encode_batches(
    batches: list[tuple[int, list[dict[str, Any]]]], *, job: str, use_gzip: bool
) -> list[Batch]:
    """Request bodies as a replica's collector sends them: rank 0 of world size 1 (no
    ``RANK`` in a server's environment), the replica's host."""
    out = []
    for replica, events in batches:
        body = orjson.dumps(
            {
                "batch_id": str(uuid.uuid4()),
                "job": job,
                "kind": "serving",
                "rank": 0,
                "world_size": 1,
                "host": f"serve-{replica}",
                "attempt": 0,
                "events": events,
            }
        )
        if use_gzip:
            body = gzip.compress(body, compresslevel=6)
        out.append(Batch(0, events, body))
    return out


def create_slos(endpoint: str, admin_token: str, job: str, count: int) -> list[int]:
    """Define ``count`` SLOs for ``job`` (before its first request, so nothing to rebuild)."""
    ids = []
    headers = {"Authorization": f"Bearer {admin_token}"}
    with httpx.Client(base_url=endpoint, headers=headers, timeout=60.0) as client:
        for i in range(count):
            thresholds = SLO_TEMPLATES[i % len(SLO_TEMPLATES)]
            reply = client.post(
                "/api/v1/slos",
                json={"job": job, "name": f"bench-{i}", "objective": 0.99, **thresholds},
            )
            if reply.status_code != 201:
                raise SystemExit(f"creating SLO {i}: HTTP {reply.status_code}: {reply.text[:200]}")
            ids.append(reply.json()["id"])
    return ids


def warm_up(endpoint: str, token: str, job: str, tokens: int, concurrency: int) -> None:
    """Open the server's DB connections and warm the request path, untimed, on another job."""
    warm = make_requests(concurrency * 10, tokens=tokens, replicas=2, batch=10, rate=50, seed=1)
    batches = encode_batches(warm, job=f"{job}-warmup", use_gzip=False)
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


def request_row(job_id: int, e: dict[str, Any]) -> tuple[Any, ...]:
    """A ``requests`` row in ``REQUEST_COLUMNS`` order, as ingest stores the event."""
    times = e.get("token_times")
    return (
        job_id,
        0,
        e["id"],
        e["arrival"],
        e.get("first_token"),
        e.get("end"),
        e.get("prompt_tokens"),
        e.get("output_tokens"),
        e.get("max_tbt_s"),
        e.get("status", "ok"),
        e.get("queue_s"),
        e.get("model"),
        e.get("replica"),
        times.get("stride", 1) if times else None,
        base64.b64decode(times["data"], validate=True) if times else None,
    )


def copy_load(dsn: str, job: str, batches: list[Batch]) -> tuple[int, float, float, int]:
    """Load the same request rows with one ``COPY`` into a scratch copy of ``requests``.

    The scratch table has the columns, indexes, primary key and foreign keys of
    ``requests`` (its own id sequence), and its rows point at the API run's job; it is
    dropped afterwards. Returns (rows, seconds, CPU seconds of the PostgreSQL backend that
    ran the COPY, request rows the API run stored for ``job``). The clock covers turning
    the events into rows (base64 decoding the token times included), the COPY and the
    commit.
    """
    import psycopg

    scratch = f"bench_copy_requests_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(dsn) as conn:
        found = conn.execute("SELECT id FROM jobs WHERE name = %s", (job,)).fetchone()
        if found is None:
            raise SystemExit(f"copy: job {job!r} is not in the database (nothing was stored)")
        job_id = found[0]
        foreign_keys = [
            definition
            for (definition,) in conn.execute(
                "SELECT pg_get_constraintdef(oid) FROM pg_constraint"
                " WHERE conrelid = 'requests'::regclass AND contype = 'f'"
            )
        ]
        conn.execute(
            f"CREATE TABLE {scratch} (LIKE requests INCLUDING CONSTRAINTS INCLUDING INDEXES)"
        )
        conn.execute(f"CREATE SEQUENCE {scratch}_id_seq OWNED BY {scratch}.id")
        conn.execute(f"ALTER TABLE {scratch} ALTER id SET DEFAULT nextval('{scratch}_id_seq')")
        for definition in foreign_keys:
            conn.execute(f"ALTER TABLE {scratch} ADD {definition}")
        conn.commit()
        try:
            backend_pid = conn.info.backend_pid
            rows = 0
            cpu0 = process_cpu_s(backend_pid)
            started = time.perf_counter()
            columns = ", ".join(f'"{c}"' for c in REQUEST_COLUMNS)
            with conn.cursor() as cur, cur.copy(f"COPY {scratch} ({columns}) FROM STDIN") as copy:
                for batch in batches:
                    for e in batch.events:
                        copy.write_row(request_row(job_id, e))
                        rows += 1
            conn.commit()
            seconds = time.perf_counter() - started
            backend_cpu = process_cpu_s(backend_pid) - cpu0  # nan when PostgreSQL is not local
            stored = conn.execute(
                "SELECT count(*) FROM requests WHERE job_id = %s", (job_id,)
            ).fetchone()[0]
        finally:
            conn.rollback()
            conn.execute(f"DROP TABLE IF EXISTS {scratch}")
            conn.commit()
    return rows, seconds, backend_cpu, stored


# --------------------------------------------------------------------------- main


def machine_busy_s() -> float:
    """CPU seconds all cores have spent busy since boot (Linux ``/proc/stat``: user, nice,
    system, irq, softirq, steal); ``nan`` elsewhere. Tells how much the run shared the
    machine with other work."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return math.nan
    user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, fields[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--endpoint", "--url", default="http://127.0.0.1:8000", help="server base URL")
    p.add_argument("--token", default="vigil-dev-ingest", help="ingest bearer token")
    p.add_argument(
        "--admin-token", default="vigil-dev-admin", help="admin bearer token (for --slos)"
    )
    p.add_argument("--requests", type=int, default=200_000, help="request events to send")
    p.add_argument("--tokens", type=int, default=200, help="mean output tokens per request")
    p.add_argument("--batch", type=int, default=1000, help="requests per batch")
    p.add_argument("--concurrency", type=int, default=4, help="concurrent senders (threads)")
    p.add_argument("--replicas", type=int, default=4, help="replicas the batches come from")
    p.add_argument("--rate", type=float, default=200.0, help="simulated fleet requests/s")
    p.add_argument("--slos", type=int, default=0, help="SLOs to define for the job first")
    p.add_argument("--gzip", action="store_true", help="send gzip-compressed bodies")
    p.add_argument("--copy-dsn", help="also COPY the same rows into this PostgreSQL database")
    p.add_argument("--job", help="job name (default: bench-serving-<UTC time>)")
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
    if not 1 <= args.requests <= MAX_EVENTS:
        p.error(f"--requests must be 1..{MAX_EVENTS:,}")
    if not 1 <= args.tokens <= 100_000:
        p.error("--tokens must be 1..100000")
    if not 1 <= args.batch <= args.requests:
        p.error("--batch must be 1..--requests")
    if not 1 <= args.concurrency <= 64:
        p.error("--concurrency must be 1..64")
    if not 1 <= args.replicas <= 1000:
        p.error("--replicas must be 1..1000")
    if not 0 < args.rate <= 1e6:
        p.error("--rate must be in (0, 1e6]")
    if not 0 <= args.slos <= 50:
        p.error("--slos must be 0..50")
    if not 0 < args.timeout <= 3600:
        p.error("--timeout must be in (0, 3600]")
    require_loopback(urlsplit(args.endpoint).hostname, "--endpoint")
    args.copy_dbname = copy_dbname(p, args.copy_dsn)
    args.job = args.job or f"bench-serving-{datetime.now(UTC):%Y%m%dT%H%M%S}"
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    endpoint = args.endpoint.rstrip("/")

    t = time.perf_counter()
    raw = make_requests(
        args.requests,
        tokens=args.tokens,
        replicas=args.replicas,
        batch=args.batch,
        rate=args.rate,
    )
    batches = encode_batches(raw, job=args.job, use_gzip=args.gzip)
    encode_s = time.perf_counter() - t
    body_mb = sum(len(b.body) for b in batches) / 1e6
    token_times = sum(
        len(e["token_times"]["data"]) for b in batches for e in b.events if "token_times" in e
    )
    print(
        f"job {args.job}: {args.requests:,} requests of ~{args.tokens} tokens in "
        f"{len(batches):,} batches of ≤{args.batch:,}, {args.replicas} replicas, "
        f"concurrency {args.concurrency}, {args.slos} SLOs, gzip {'on' if args.gzip else 'off'}; "
        f"bodies {body_mb:.1f} MB{' gzipped' if args.gzip else ''} "
        f"(token times: {token_times / 1e6:.1f} MB of base64 before any gzip), "
        f"built and encoded in {encode_s:.2f} s (not timed)"
    )

    if args.slos:
        create_slos(endpoint, args.admin_token, args.job, args.slos)
    if not args.no_warmup:
        warm_up(endpoint, args.token, args.job, args.tokens, args.concurrency)

    busy0 = machine_busy_s()
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
    summary: dict[str, Any] = {
        "job": args.job,
        "endpoint": endpoint,
        "tokens": args.tokens,
        "batch": args.batch,
        "concurrency": args.concurrency,
        "replicas": args.replicas,
        "slos": args.slos,
        "gzip": args.gzip,
    } | report_api_run(run, noun="request")
    busy = machine_busy_s() - busy0
    if not math.isnan(busy):
        line = f"machine: {busy:.1f} s CPU busy over {os.cpu_count()} cores during the API run"
        summary["machine_busy_cpu_s"] = round(busy, 2)
        if args.server_pid:
            ours = run.client_cpu + run.server_cpu + (0.0 if math.isnan(run.pg_cpu) else run.pg_cpu)
            line += (
                f", {busy - ours:.1f} s of it not the client's, the server's or its PostgreSQL "
                "backends' (other work, PostgreSQL's own processes, the kernel)"
            )
            summary["others_cpu_s"] = round(busy - ours, 2)
        print(line)

    if args.copy_dsn:
        rows, copy_s, copy_cpu, stored = copy_load(args.copy_dsn, args.job, batches)
        copy_rate = rows / copy_s
        summary |= {
            "copy_rows": rows,
            "copy_seconds": round(copy_s, 3),
            "copy_rows_per_s": round(copy_rate),
            "api_copy_ratio": round(run.rate / copy_rate, 3),
            "api_rows_stored": stored,
            "copy_pg_us_per_row": round(copy_cpu * 1e6 / rows, 1),
        }
        print(
            f"copy:    {rows:,} rows in {copy_s:.2f} s, {copy_rate:,.0f} rows/s; "
            f"PostgreSQL backend {copy_cpu * 1e6 / rows:.0f} µs/row"
        )
        print(f"ratio:   API requests/s ÷ COPY rows/s = {run.rate / copy_rate:.3f}")
        if stored != run.tally.events:
            print(f"warning: the database holds {stored:,} request rows for {args.job}")
    if args.json:
        print(orjson.dumps(summary).decode())
    return 1 if run.tally.errors else 0


if __name__ == "__main__":
    sys.exit(main())
