"""Per-host relay benchmark (issue 16, item 2): what N simulated ranks cost the server with
and without ``collector.relay``.

Each simulated rank is a real ``collector.Client`` (its own worker thread, buffer and
retries) making one step a second, with the default 1-s heartbeat and 1-s flush: one
request a second per rank, as a training job at 1 step/s sends. Ranks live in
``--processes`` host processes; ``--ranks-per-node`` of them make a node. In ``relay`` mode
each node's ranks send to their node's relay (``python -m collector.relay``, one process
per node) instead of to the server.

For each mode it reports, over ``--seconds`` after ``--warmup``: the HTTP requests and
batches the server took per second (its ``vigil_ingest_requests_total`` and
``vigil_ingest_batches_total``), 429s, the server's and the relays' CPU,
the server's mean time per batch, and at the end every step stored or not.

This is a benchmark, not a test: it prints figures and asserts nothing. It starts its own
``vigil server`` (embedded mode, one process) on the database given, and talks only to
127.0.0.1::

    .venv/bin/python bench/relay.py \\
        --database-url postgresql+psycopg://postgres@127.0.0.1:5432/vigil_bench_relay \\
        --ranks 512 --ranks-per-node 8 --processes 8 --seconds 60
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.ingest import process_cpu_s

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "vigil-dev-ingest"
ADMIN = {"Authorization": "Bearer vigil-dev-admin"}
REQUESTS = ("vigil_ingest_requests_total:single", "vigil_ingest_requests_total:multi")


# -- a host process: the simulated ranks ------------------------------------------------------


def host(args: argparse.Namespace) -> None:
    """Ranks ``--first``…``--first + --count - 1``, stepping once a second until
    ``--steps``; then a flush, and one JSON line of their collectors' totals."""
    from collector.client import Client
    from collector.config import Config

    endpoints = json.loads(args.endpoints)  # one per rank of this process
    clients = [
        Client(
            Config.resolve(
                job=args.job,
                endpoint=endpoints[i],
                token=TOKEN,
                environ={
                    "RANK": str(args.first + i),
                    "WORLD_SIZE": str(args.world),
                    "VIGIL_RUN_ID": args.job,
                    "VIGIL_HOSTNAME": f"node-{(args.first + i) // args.per_node}",
                },
            )
        )
        for i in range(args.count)
    ]
    start = time.monotonic()
    for n in range(args.steps):
        for client in clients:
            client.begin_step(n)
        time.sleep(max(0.0, start + n + 0.9 - time.monotonic()))
        for client in clients:
            client.log(loss=2.0)
            client.end_step()
        time.sleep(max(0.0, start + n + 1 - time.monotonic()))
    delivered = all(c.flush(timeout=120) for c in clients)
    totals: dict[str, Any] = {"delivered": delivered, "requests": 0, "dropped": 0}
    for client in clients:
        stats = client.stats()
        totals["requests"] += stats["sent_batches"]
        totals["dropped"] += sum(stats["dropped"].values())
    print(json.dumps(totals), flush=True)
    os._exit(0)  # 500 worker threads' exit flushes are done already


# -- the driver -------------------------------------------------------------------------------


def server_counters(base: str) -> dict[str, float]:
    text = httpx.get(f"{base}/metrics", headers=ADMIN, timeout=30).text
    out: dict[str, float] = {}
    for line in text.splitlines():
        for name in (
            "vigil_ingest_requests_total",
            "vigil_ingest_batches_total",
            "vigil_ingest_seconds_sum",
            "vigil_ingest_seconds_count",
        ):
            if line.startswith(name):
                label = line.split('"')[1] if '"' in line else ""
                key = f"{name}:{label}" if label else name
                out[key] = float(line.rsplit(" ", 1)[1])
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stored_steps(database_url: str, job: str) -> tuple[int, int]:
    """Step rows stored for ``job``, and how many of them are a (rank, step) seen before."""
    from sqlalchemy import create_engine, text

    engine = create_engine(database_url)
    rows_of_job = (
        "SELECT s.rank, s.step FROM steps s JOIN jobs j ON j.id = s.job_id WHERE j.name = :job"
    )
    try:
        with engine.connect() as conn:
            rows = conn.scalar(text(f"SELECT count(*) FROM ({rows_of_job}) t"), {"job": job})
            distinct = conn.scalar(
                text(f"SELECT count(*) FROM (SELECT DISTINCT rank, step FROM ({rows_of_job}) t) u"),
                {"job": job},
            )
    finally:
        engine.dispose()
    dupes = (rows or 0) - (distinct or 0)
    return int(rows), int(dupes)


def run_mode(args: argparse.Namespace, base: str, mode: str) -> dict[str, Any]:
    job = f"relay-bench-{mode}-{int(time.time())}"
    nodes = (args.ranks + args.ranks_per_node - 1) // args.ranks_per_node
    relays: list[subprocess.Popen[bytes]] = []
    if mode == "relay":
        ports = [free_port() for _ in range(nodes)]
        for port in ports:
            cmd = [sys.executable, "-m", "collector.relay", "--listen", f"127.0.0.1:{port}"]
            cmd += ["--endpoint", base, "--token", TOKEN, "--log-level", "WARNING"]
            relays.append(subprocess.Popen(cmd, cwd=ROOT))
        for port in ports:
            wait_http(f"http://127.0.0.1:{port}/healthz")
        endpoint_of = [
            f"http://127.0.0.1:{ports[r // args.ranks_per_node]}"
            for r in range(nodes * args.ranks_per_node)
        ]
    else:
        endpoint_of = [base] * args.ranks
    at_start = server_counters(base)  # for the whole run's totals
    steps = int(args.warmup + args.seconds + 5)
    per = (args.ranks + args.processes - 1) // args.processes
    hosts = []
    for first in range(0, args.ranks, per):
        count = min(per, args.ranks - first)
        cmd = [sys.executable, __file__, "--host", "--job", job, "--first", str(first)]
        cmd += ["--count", str(count), "--world", str(args.ranks), "--steps", str(steps)]
        cmd += ["--per-node", str(args.ranks_per_node)]
        cmd += ["--endpoints", json.dumps(endpoint_of[first : first + count])]
        hosts.append(subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True))
    time.sleep(args.warmup)
    before, t0 = server_counters(base), time.monotonic()
    cpu0 = cpu(args.server_pid, relays)
    time.sleep(args.seconds)
    after, t1 = server_counters(base), time.monotonic()
    cpu1 = cpu(args.server_pid, relays)
    reports = [json.loads(h.communicate(timeout=600)[0].strip().splitlines()[-1]) for h in hosts]
    at_end = server_counters(base)
    for proc in relays:
        proc.terminate()
    for proc in relays:
        proc.wait(timeout=30)
    span = t1 - t0
    stored = stored_steps(args.database_url, job)

    def rate(key: str) -> float:
        return (after.get(key, 0.0) - before.get(key, 0.0)) / span

    batches = rate("vigil_ingest_batches_total:stored") + rate(
        "vigil_ingest_batches_total:duplicate"
    )
    store_s = after.get("vigil_ingest_seconds_sum", 0) - before.get("vigil_ingest_seconds_sum", 0)
    stored_n = after.get("vigil_ingest_seconds_count", 0) - before.get(
        "vigil_ingest_seconds_count", 0
    )
    return {
        "mode": mode,
        "ranks": args.ranks,
        "nodes": nodes,
        "seconds": round(span, 1),
        "requests_per_s": round(sum(rate(k) for k in REQUESTS), 1),
        "batches_per_s": round(batches, 1),
        "throttled_per_s": round(rate("vigil_ingest_batches_total:throttled"), 2),
        "ms_per_batch": round(1000 * store_s / stored_n, 2) if stored_n else None,
        "server_cpu": round((cpu1["server"] - cpu0["server"]) / span, 3),
        "relays_cpu": round((cpu1["relays"] - cpu0["relays"]) / span, 3),
        "steps_made": args.ranks * steps,
        "steps_stored": stored[0],
        "steps_stored_twice": stored[1],
        # The whole run, flush at the end included: requests the ranks got answered (by
        # the server, or through their relay), and requests the server received.
        "rank_requests": sum(r["requests"] for r in reports),
        "server_requests": int(sum(at_end.get(k, 0) - at_start.get(k, 0) for k in REQUESTS)),
        "delivered": all(r["delivered"] for r in reports),
        "dropped": sum(r["dropped"] for r in reports),
    }


def cpu(server_pid: int, relays: list[subprocess.Popen[bytes]]) -> dict[str, float]:
    return {
        "server": process_cpu_s(server_pid),
        "relays": sum(process_cpu_s(p.pid) for p in relays),
    }


def wait_http(url: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{url} did not answer within {timeout} s")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--database-url", help="the server's database (a fresh one)")
    p.add_argument("--ranks", type=int, default=512)
    p.add_argument("--ranks-per-node", type=int, default=8)
    p.add_argument("--processes", type=int, default=8, help="host processes for the ranks")
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--warmup", type=float, default=15.0)
    p.add_argument("--modes", default="direct,relay")
    p.add_argument("--json", action="store_true")
    # a host process (internal)
    p.add_argument("--host", action="store_true", help=argparse.SUPPRESS)
    for name in ("--job", "--endpoints"):
        p.add_argument(name, help=argparse.SUPPRESS)
    for name in ("--first", "--count", "--world", "--steps", "--per-node"):
        p.add_argument(name, type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.host:
        host(args)
        return
    if not args.database_url:
        p.error("--database-url is required")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("VIGIL_")}
    env.update(VIGIL_DATABASE_URL=args.database_url, VIGIL_LOG_LEVEL="WARNING")
    server = subprocess.Popen(
        [sys.executable, "-m", "backend", "server", "--port", str(port), "--migrate"],
        env=env,
        cwd=ROOT,
    )
    args.server_pid = server.pid
    try:
        wait_http(f"{base}/healthz")
        for mode in args.modes.split(","):
            result = run_mode(args, base, mode)
            line = (
                json.dumps(result)
                if args.json
                else "  ".join(f"{k}={v}" for k, v in result.items())
            )
            print(line, flush=True)
    finally:
        server.terminate()
        server.wait(timeout=30)


if __name__ == "__main__":
    main()
