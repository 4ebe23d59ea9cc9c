"""What day partitions cost and save on PostgreSQL: COPY into ``steps`` plain (revision 0013)
and partitioned (0014), then ageing out the oldest day (DELETE + VACUUM against DROP of its
partition), and the detectors' step-window query on each.

A benchmark, not a test: it prints a table and asserts nothing. It (re)creates the database
named in ``--dsn`` (refused unless on loopback and named ``*bench*``), so point it at a
scratch one::

    .venv/bin/python bench/partitions.py \\
        --dsn postgresql+psycopg://postgres@127.0.0.1:5432/vigil_bench_partitions

Backend CPU is read from ``/proc`` (the database runs on this machine): the steadiest
figure on a shared machine.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

import psycopg
from sqlalchemy import make_url

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from backend.db import make_engine
from backend.migrate import upgrade
from backend.telemetry import partitions
from backend.telemetry.partitions import DAY_S, day_of

COLUMNS = "job_id, rank, attempt, step, ts, duration_s, comm_s, data_s, loss, grad_norm, mem_bytes"


def backend_cpu_s(conn: psycopg.Connection) -> float:
    pid = conn.info.backend_pid
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def recreate(dsn: str, revision: str) -> str:
    url = make_url(dsn)
    admin = url.set(database="postgres").render_as_string(hide_password=False)
    with psycopg.connect(admin.replace("+psycopg", ""), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{url.database}"')
        conn.execute(f'CREATE DATABASE "{url.database}"')
    upgrade(dsn, revision)
    return dsn.replace("+psycopg", "")


def timed(conn: psycopg.Connection, work: object) -> tuple[float, float]:
    """Wall and backend CPU seconds of ``work(conn)``, committed."""
    cpu, wall = backend_cpu_s(conn), time.perf_counter()
    work(conn)  # type: ignore[operator]
    conn.commit()
    return time.perf_counter() - wall, backend_cpu_s(conn) - cpu


def run(dsn: str, *, partitioned: bool, rows_per_day: int, days: int) -> dict[str, float]:
    plain = recreate(dsn, "head" if partitioned else "0013")
    today = day_of(time.time())
    first = today - days + 1
    if partitioned:
        engine = make_engine(dsn)
        with engine.begin() as conn:
            for day in range(first, today):
                partitions.add_day(conn, "steps", day)
        engine.dispose()
    jobs, ranks = 8, 8
    per_rank = rows_per_day // (jobs * ranks)
    out: dict[str, float] = {}
    with psycopg.connect(plain) as conn:

        def load(c: psycopg.Connection) -> None:
            with c.cursor().copy(f"COPY steps ({COLUMNS}) FROM STDIN") as copy:
                for d in range(days):
                    t0 = (first + d) * DAY_S
                    for s in range(per_rank):
                        step, ts = d * per_rank + s, t0 + s * DAY_S / per_rank
                        for job in range(1, jobs + 1):
                            for r in range(ranks):
                                copy.write_row(
                                    (job, r, 0, step, ts, 0.31, 0.05, 0.01, 2.3, 1.1, 10**9)
                                )

        out["copy_s"], out["copy_cpu_s"] = timed(conn, load)
        out["rows"] = float(days * jobs * ranks * per_rank)
        conn.execute("ANALYZE steps")
        conn.commit()
        # The detectors' window read (backend.detection.window), client-timed, best of 20.
        window = (
            "SELECT rank, step, duration_s FROM steps WHERE job_id = 3 AND attempt = 0 "
            "AND step >= %s"
        )
        best = math.inf
        for _ in range(20):
            started = time.perf_counter()
            conn.execute(window, (days * per_rank - 200,)).fetchall()
            best = min(best, time.perf_counter() - started)
        conn.commit()
        out["window_ms"] = best * 1000

        def age_out(c: psycopg.Connection) -> None:
            if partitioned:
                c.execute(f'DROP TABLE "{partitions.partition_name("steps", first)}"')
            else:
                c.execute("DELETE FROM steps WHERE ts < %s", ((first + 1) * DAY_S,))

        out["age_s"], out["age_cpu_s"] = timed(conn, age_out)
        if not partitioned:  # the dead rows must be vacuumed before their space is reused
            conn.autocommit = True
            wall, cpu = time.perf_counter(), backend_cpu_s(conn)
            conn.execute("VACUUM steps")
            out["age_s"] += time.perf_counter() - wall
            out["age_cpu_s"] += backend_cpu_s(conn) - cpu
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--rows-per-day", type=int, default=200_000)
    parser.add_argument("--days", type=int, default=3)
    args = parser.parse_args()
    url = make_url(args.dsn)
    if url.host not in ("127.0.0.1", "localhost", "::1") or "bench" not in (url.database or ""):
        sys.exit("--dsn must be a loopback database whose name contains 'bench'")
    print(f"{args.days} days × {args.rows_per_day:,} step rows a day, 8 jobs × 8 ranks")
    print(
        "| steps | COPY rows/s | COPY backend µs/row | window query ms | age out 1 day s "
        "| age out backend CPU s |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for partitioned in (False, True):
        r = run(args.dsn, partitioned=partitioned, rows_per_day=args.rows_per_day, days=args.days)
        name = "partitioned (0014)" if partitioned else "plain (0013)"
        print(
            f"| {name} | {r['rows'] / r['copy_s']:,.0f} | {r['copy_cpu_s'] / r['rows'] * 1e6:.1f} "
            f"| {r['window_ms']:.2f} | {r['age_s']:.2f} | {r['age_cpu_s']:.2f} |"
        )


if __name__ == "__main__":
    main()
