"""Dashboard benchmark: a job of 1,024 ranks × 10,000 steps in PostgreSQL; how fast do the
job page's API queries answer (p50/p99), and how long until the job page has drawn every
chart in a real browser (Debian's Chromium via Playwright)?

This is a benchmark, not a test: it prints figures and asserts nothing. It loads the data
with ``COPY`` straight into a database of its own (10,240,000 step rows, rank 617 a
straggler from step 4,000; 2 process groups of collectives every 10th step), starts
``vigil server`` on it, and measures::

    .venv/bin/python bench/dashboard.py \\
        --dsn postgresql+psycopg://postgres@127.0.0.1:5432/vigil_bench_ui
    .venv/bin/python bench/dashboard.py --dsn … --reuse      # keep the loaded data

Targets (issue 6): the page renders in < 1.5 s; the API behind it answers p99 < 100 ms.
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import psycopg
from sqlalchemy import make_url

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from backend.db import make_engine, make_sessionmaker, session_scope  # noqa: E402
from backend.migrate import upgrade  # noqa: E402
from backend.telemetry.rollups import rebuild_rollups  # noqa: E402
from tests.servers import live_server  # noqa: E402

JOB = "bench-1024x10000"
ADMIN = {"Authorization": "Bearer vigil-dev-admin"}
T0 = 1_795_000_000.0


def load(dsn: str, ranks: int, steps: int) -> None:
    """Create the job and COPY its steps and collectives (one attempt, no incidents), then
    compute the step rollups that ingest would have kept."""
    url = make_url(dsn)
    admin = url.set(database="postgres").render_as_string(hide_password=False)
    with psycopg.connect(admin.replace("+psycopg", ""), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{url.database}"')
        conn.execute(f'CREATE DATABASE "{url.database}"')
    upgrade(dsn)
    plain = dsn.replace("+psycopg", "")
    rng = np.random.default_rng(0)
    started = time.perf_counter()
    with psycopg.connect(plain) as conn:
        job_id = conn.execute(
            "INSERT INTO jobs (name, kind, world_size, attempt, created_at) "
            "VALUES (%s, 'training', %s, 0, now()) RETURNING id",
            (JOB, ranks),
        ).fetchone()[0]  # type: ignore[index]
        with conn.cursor().copy(
            "COPY ranks (job_id, rank, host, attempt, last_step, last_step_ts, "
            "last_heartbeat_ts, exited, last_seen_at) FROM STDIN"
        ) as copy:
            for r in range(ranks):
                end = T0 + steps * 0.5
                copy.write_row((job_id, r, f"node-{r // 8}", 0, steps - 1, end, end, False, "now"))
        chunk = 250
        for first in range(0, steps, chunk):
            n = min(chunk, steps - first)
            compute = 0.3 * (1 + 0.02 * rng.standard_normal((ranks, n)))
            step_ids = np.arange(first, first + n)
            if first + n > 4000:
                compute[617, step_ids >= 4000] *= 1.4
            duration = np.broadcast_to(compute.max(axis=0) + 0.05, (ranks, n))
            comm = duration - compute
            buf = io.StringIO()
            for r in range(ranks):
                for j in range(n):
                    s = first + j
                    buf.write(
                        f"{job_id}\t{r}\t0\t{s}\t{T0 + s * 0.5}\t{duration[r, j]:.5f}\t"
                        f"{comm[r, j]:.5f}\t0.001\t{2.5 - s * 1e-4:.4f}\t1.0\t"
                        f"{8_000_000_000 + s * 1000}\t4096\n"
                    )
            with conn.cursor().copy(
                "COPY steps (job_id, rank, attempt, step, ts, duration_s, comm_s, data_s, loss, "
                "grad_norm, mem_bytes, tokens) FROM STDIN"
            ) as copy:
                copy.write(buf.getvalue())
            coll = io.StringIO()
            for s in range(first - first % 10, first + n, 10):
                if s < first:
                    continue
                for r in range(ranks):
                    for group, size in (("dp", 33_554_432), ("tp", 4_194_304)):
                        coll.write(
                            f"{job_id}\t{r}\t0\t{s}\t{group}\tall_reduce\t{size}\t"
                            f"{0.01 + 0.001 * rng.random():.5f}\t4\n"
                        )
            with conn.cursor().copy(
                'COPY collectives (job_id, rank, attempt, step, "group", op, bytes, '
                "duration_s, count) FROM STDIN"
            ) as copy:
                copy.write(coll.getvalue())
            conn.commit()
            done = first + n
            rate = done * ranks / (time.perf_counter() - started)
            print(f"\rloaded {done:,}/{steps:,} steps × {ranks} ranks ({rate:,.0f} rows/s)", end="")
    # COPY went around ingest, so the charts' rollups are computed from the steps here.
    engine = make_engine(dsn)
    try:
        with session_scope(make_sessionmaker(engine), write=True) as session:
            rebuild_rollups(session=session, job_id=job_id)
    finally:
        engine.dispose()
    with psycopg.connect(plain, autocommit=True) as conn:
        conn.execute("ANALYZE")
    print(f"\nloaded in {time.perf_counter() - started:.0f} s (rollups included)")


def api_latencies(base: str, rounds: int) -> dict[str, list[float]]:
    paths = {
        "job": f"/api/v1/jobs/{JOB}",
        "overview": f"/api/v1/jobs/{JOB}/overview",
        "series": f"/api/v1/jobs/{JOB}/series",
        "heatmap": f"/api/v1/jobs/{JOB}/heatmap",
        "bandwidth": f"/api/v1/jobs/{JOB}/bandwidth",
        "ranks": f"/api/v1/jobs/{JOB}/ranks",
        "incidents": f"/api/v1/jobs/{JOB}/incidents",
    }
    out: dict[str, list[float]] = {name: [] for name in paths}
    with httpx.Client(base_url=base, headers=ADMIN, timeout=60) as client:
        for name, path in paths.items():
            client.get(path).raise_for_status()  # warm the caches once
            for _ in range(rounds):
                started = time.perf_counter()
                client.get(path).raise_for_status()
                out[name].append(time.perf_counter() - started)
    return out


def page_render(base: str, rounds: int) -> dict[str, list[float]]:
    """Seconds from navigation to every chart drawn: ``cold`` (a new browser profile each
    time: nothing cached) and ``warm`` (reloads in one profile: plotly.js cached, as for a
    person who keeps the dashboard open)."""
    from playwright.sync_api import sync_playwright

    charts = ("#step-time-chart", "#heatmap", "#bandwidth-chart", "#memory-chart", "#loss-chart")

    def load(page: object) -> float:
        started = time.perf_counter()
        page.goto(f"{base}/jobs/{JOB}")  # type: ignore[attr-defined]
        for chart in charts:  # (the page's CSP forbids eval, so no wait_for_function)
            page.wait_for_selector(  # type: ignore[attr-defined]
                f'{chart}[data-ready="1"]', state="attached", timeout=30_000
            )
        return time.perf_counter() - started

    out: dict[str, list[float]] = {"cold": [], "warm": []}
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path="/usr/bin/chromium", headless=True, args=["--no-sandbox"]
        )
        for i in range(rounds + 1):
            context = browser.new_context(viewport={"width": 1400, "height": 1000})
            seconds = load(context.new_page())
            if i:  # the first load warms the server
                out["cold"].append(seconds)
            context.close()
        context = browser.new_context(viewport={"width": 1400, "height": 1000})
        page = context.new_page()
        for i in range(rounds + 2):
            seconds = load(page)
            if i >= 2:  # after two loads the script is cached, compiled code included
                out["warm"].append(seconds)
        browser.close()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dsn", required=True, help="PostgreSQL URL of a database to (re)create")
    p.add_argument("--ranks", type=int, default=1024)
    p.add_argument("--steps", type=int, default=10_000)
    p.add_argument("--rounds", type=int, default=50, help="requests per API endpoint")
    p.add_argument("--page-rounds", type=int, default=5)
    p.add_argument("--reuse", action="store_true", help="keep the data a previous run loaded")
    args = p.parse_args()
    if not args.reuse:
        load(args.dsn, args.ranks, args.steps)
    with live_server(args.dsn, VIGIL_DETECT_INTERVAL_S="0") as base:
        lat = api_latencies(base, args.rounds)
        print(f"\nAPI, {args.rounds} requests each (ms)      p50      p99      max")
        worst = 0.0
        for name, values in lat.items():
            ms = sorted(v * 1000 for v in values)
            p99 = ms[min(len(ms) - 1, round(0.99 * (len(ms) - 1)))]
            worst = max(worst, p99)
            print(f"  {name:<30} {statistics.median(ms):8.1f} {p99:8.1f} {ms[-1]:8.1f}")
        print(f"\n{'PASS' if worst < 100 else 'FAIL'}  API p99 < 100 ms (worst {worst:.1f} ms)")
        if args.page_rounds <= 0:
            return
        renders = page_render(base, args.page_rounds)
        for kind, values in renders.items():
            print(
                f"job page until every chart is drawn, {kind} (s): median "
                f"{statistics.median(values):.2f}, max {max(values):.2f} over {len(values)} loads"
            )
        worst_page = max(renders["warm"])
        print(
            f"{'PASS' if worst_page < 1.5 else 'FAIL'}  job page < 1.5 s with plotly.js cached "
            f"(max {worst_page:.2f} s; cold max {max(renders['cold']):.2f} s)"
        )


if __name__ == "__main__":
    main()
