"""``vigil demo --replay``: start Vigil embedded and replay a real training job into it.

The job is Alibaba PAI's ``job_1`` (examples/data/pai_minibatch, CC-BY 4.0): per-worker
mini-batch times of a real 10-worker training job in which worker 6 turns into a straggler
around iterations 1800-2000. It goes through the same ingest API a collector uses, as one
run of the job (a replay again is another run), and, like a collector at the end of a job,
each worker says goodbye with exit code 0: the run finished, nothing crashed.
"""

from __future__ import annotations

import csv
import statistics
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

from backend.demo.server import DemoServer, DemoServerError, embedded_server

PAI_TRACE = Path(__file__).resolve().parents[2] / "examples/data/pai_minibatch/job_1_norm.csv"
DEMO_JOB = "pai-job-1"
STEPS_PER_BATCH = 50


def load_pai_trace(path: Path = PAI_TRACE) -> dict[int, list[tuple[int, float]]]:
    """worker → [(iteration, batch time in seconds)], sorted by iteration.

    The trace is normalised to 0-1000; read as milliseconds it gives plausible step times.
    """
    per_worker: dict[int, list[tuple[int, float]]] = defaultdict(list)
    with path.open() as f:
        for row in csv.DictReader(f):
            per_worker[int(row["worker"])].append(
                (int(row["time"]), int(row["batch_time_norm"]) / 1000.0)
            )
    for rows in per_worker.values():
        rows.sort()
    return dict(per_worker)


def pai_batches(job: str = DEMO_JOB, *, now: float | None = None) -> list[dict[str, Any]]:
    """The trace as ingest batches, one rank's steps at a time, ending at ``now``; each
    worker's last batch carries its goodbye (the job ended there)."""
    trace = load_pai_trace()
    world = len(trace)
    now = time.time() if now is None else now
    run = f"replay-{uuid.uuid4().hex[:12]}"
    batches = []
    for worker, rows in sorted(trace.items()):
        # Samples are ~10 iterations apart; time advances by the iterations in between.
        elapsed, stamps = 0.0, []
        previous = rows[0][0]
        for iteration, seconds in rows:
            elapsed += seconds * max(1, iteration - previous)
            previous = iteration
            stamps.append(elapsed)
        start = now - elapsed
        events: list[dict[str, Any]] = [
            {"type": "step", "step": it, "ts": start + stamp, "duration_s": seconds}
            for (it, seconds), stamp in zip(rows, stamps, strict=True)
        ]
        for i in range(0, len(events), STEPS_PER_BATCH):
            chunk = events[i : i + STEPS_PER_BATCH]
            last = chunk[-1]
            beat = {"type": "heartbeat", "ts": last["ts"], "step": last["step"] + 1}
            if i + STEPS_PER_BATCH >= len(events):  # the worker's last batch: it exits
                beat.update(exiting=True, exit_code=0)
            chunk.append(beat)
            batches.append(
                {
                    "batch_id": str(uuid.uuid4()),
                    "job": job,
                    "run": run,
                    "kind": "training",
                    "rank": worker,
                    "world_size": world,
                    "host": f"pai-node-{worker // 4}",
                    "events": chunk,
                }
            )
    return batches


def run_replay(*, console: Console, port: int, database_url: str, fast: bool) -> int:
    try:
        with embedded_server(database_url=database_url, port=port) as vigil:
            console.print(f"[bold]Vigil demo[/bold] (replay) · database {database_url}")
            _replay(console, vigil)
            if not fast:
                console.print("Serving until Ctrl-C.")
                vigil.serve_until_interrupted()
    except DemoServerError as exc:
        console.print(f"[red]{exc}[/red]")
        return 1
    return 0


def _replay(console: Console, vigil: DemoServer) -> None:
    base = vigil.base
    ingest_token, admin_token = vigil.token("ingest"), vigil.token("admin")
    batches = pai_batches()
    with httpx.Client(base_url=base, timeout=30) as client:
        sent = 0
        with console.status("replaying PAI job_1 (10 workers, real step times)…"):
            for batch in batches:
                reply = client.post(
                    "/api/v1/ingest",
                    json=batch,
                    headers={"Authorization": f"Bearer {ingest_token}"},
                )
                reply.raise_for_status()
                sent += reply.json()["accepted"]
        read = {"Authorization": f"Bearer {admin_token}"}
        job = client.get(f"/api/v1/jobs/{DEMO_JOB}", headers=read).json()
        ranks = client.get(f"/api/v1/jobs/{DEMO_JOB}/ranks", headers=read).json()
        window = client.get(
            f"/api/v1/jobs/{DEMO_JOB}/steps",
            params={"from_step": 1800, "to_step": 2000, "limit": 10_000},
            headers=read,
        ).json()["items"]

    console.print(f"stored {sent} events in {len(batches)} batches via POST /api/v1/ingest")
    console.print(
        f"job [bold]{DEMO_JOB}[/bold] (run #{job['run']['number']}): "
        f"{len(ranks)}/{job['world_size']} ranks, "
        f"last step {job['last_step']}, median step {job['step_time_median_s']:.3f} s"
    )
    per_rank: dict[int, list[float]] = defaultdict(list)
    for s in window:
        per_rank[s["rank"]].append(s["duration_s"])
    table = Table("rank", "host", "last step", "median step 1800-2000 (s)", title="ranks")
    overall = statistics.median(d for v in per_rank.values() for d in v)
    for r in ranks:
        med = statistics.median(per_rank[r["rank"]])
        style = "bold red" if med > 1.5 * overall else ""
        table.add_row(
            str(r["rank"]), r["host"] or "", str(r["last_step"]), f"{med:.3f}", style=style
        )
    console.print(table)
    console.print(
        f"\nExplore:  {base}/  ·  API docs {base}/docs\n"
        f'  curl -H "Authorization: Bearer {admin_token}" {base}/api/v1/jobs/{DEMO_JOB}/ranks'
    )
