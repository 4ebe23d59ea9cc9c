"""Make the pipeline-parallel hang cases of ``tests/data/pipeline_hangs/`` (issue 15, item 3).

From the repository root (about 15 minutes on 2 cores; the cases are stored, tests only read
them)::

    .venv/bin/python bench/pipeline_hangs.py                 # every case
    .venv/bin/python bench/pipeline_hangs.py --only pairs-stop-stage2

Each case runs ``bench/pipeline_hang_job.py`` under ``torchrun`` (gloo, CPU) with the Vigil
collector reporting to a real ``vigil server`` (SQLite), injects its faults, and once the
job has made no progress for ``--hang-s`` seconds records what the server stored of it: each
rank's latest state (the rank rows: last step, heartbeat, in-flight op), its last steps,
the process groups' members, and the step durations the hang detector learns its timeout
from, at that moment (``now``). Cases whose stages talk through per-pair process groups also
keep every rank's Flight Recorder dump taken then (``fr/_dump_<rank>``; a rank holding the
GIL cannot write one). The truth is the ranks whose fault struck (the job's log says so).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import select
from sqlalchemy.orm import Session

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from backend.db import make_engine  # noqa: E402
from backend.detection.window import load_liveness  # noqa: E402
from backend.jobs.models import Job  # noqa: E402
from backend.jobs.runs import run_ranks  # noqa: E402
from backend.launch import kill_tree  # noqa: E402
from backend.telemetry.models import StepRecord  # noqa: E402
from tests.servers import live_server  # noqa: E402

JOB_SCRIPT = ROOT / "bench" / "pipeline_hang_job.py"
OUT = ROOT / "tests" / "data" / "pipeline_hangs"
STRUCK = re.compile(r"rank (\d+): (stop|error|gil) at step (\d+) \((fwd|bwd)\)")
LAST_STEPS = 12  # steps kept per rank


@dataclass(frozen=True)
class Case:
    name: str
    style: str  # 1f1b | sendrecv | pairs
    ranks: int
    dp: int
    faults: tuple[str, ...]  # KIND:RANK:STEP[:PHASE], as pipeline_hang_job.py takes them
    note: str


# Rank = stage * dp + replica: with 8 ranks and dp 2, stage s is ranks 2s and 2s+1.
CASES = (
    Case("sendrecv-stop-stage1", "sendrecv", 8, 2, ("stop:2:20",), "stage 1 stops in forward"),
    Case("sendrecv-error-stage3", "sendrecv", 8, 2, ("error:7:20",), "last stage errors"),
    Case("sendrecv-gil-stage2", "sendrecv", 8, 2, ("gil:4:20",), "stage 2 holds the GIL"),
    Case(
        "sendrecv-gil-and-stop",
        "sendrecv",
        8,
        2,
        ("gil:3:20", "stop:4:20"),
        "two replicas: stage 1 holds the GIL, stage 2 of the other replica stops",
    ),
    Case("1f1b-stop-stage0", "1f1b", 8, 2, ("stop:1:20",), "first stage stops in forward"),
    Case("1f1b-error-stage2-bwd", "1f1b", 8, 2, ("error:4:20:bwd",), "stage 2 errors in backward"),
    Case("1f1b-gil-stage3", "1f1b", 8, 2, ("gil:6:20",), "last stage holds the GIL"),
    Case(
        "1f1b-stop-two-16",
        "1f1b",
        16,
        4,
        ("stop:6:20", "stop:13:20:bwd"),
        "16 ranks (4 stages x 4): stage 1 of replica 2 stops in forward, stage 3 of replica 1 "
        "in backward",
    ),
    Case("pairs-stop-stage2", "pairs", 8, 2, ("stop:5:20",), "stage 2 stops in forward"),
    Case(
        "pairs-error-stage1-bwd", "pairs", 8, 2, ("error:2:20:bwd",), "stage 1 errors in backward"
    ),
    Case("pairs-gil-stage0", "pairs", 8, 2, ("gil:0:20",), "first stage holds the GIL"),
    Case(
        "pairs-error-and-stop-16",
        "pairs",
        16,
        2,
        ("error:3:20", "stop:12:20:bwd"),
        "16 ranks (8 stages x 2): stage 1 errors in forward, stage 6 of the other replica "
        "stops in backward",
    ),
)


def launch(case: Case, base: str, log: Path, fr_dir: Path | None) -> subprocess.Popen[bytes]:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(case.ranks),
        str(JOB_SCRIPT),
        "--style",
        case.style,
        "--dp",
        str(case.dp),
        "--steps",
        "40",
    ]
    for f in case.faults:
        cmd += ["--fault", f]
    if fr_dir is not None:
        cmd += ["--fr-dir", str(fr_dir)]
    env = {
        **os.environ,
        "VIGIL_ENDPOINT": base,
        "VIGIL_TOKEN": "vigil-dev-ingest",
        "VIGIL_JOB": f"pipeline-{case.name}",
        "OMP_NUM_THREADS": "1",
        "GLOO_SOCKET_IFNAME": "lo",
        "TORCH_FR_BUFFER_SIZE": "128",
        "PYTHONPATH": str(ROOT),
    }
    with log.open("wb") as out:
        return subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)


def snapshot(db_url: str, job: str, now: float) -> dict[str, Any] | None:
    """What the server stored of the job, and what the hang detector would see, at ``now``."""
    engine = make_engine(db_url)
    try:
        with Session(engine) as session:
            job_id = session.scalar(select(Job.id).where(Job.name == job))
            if job_id is None:
                return None
            live = load_liveness(session=session, job_id=job_id, now=now)
            ranks = [
                {
                    "rank": r.rank,
                    "last_step": r.last_step,
                    "last_step_ts": r.last_step_ts,
                    "current_step": r.current_step,
                    "last_heartbeat_ts": r.last_heartbeat_ts,
                    "inflight": r.inflight,
                }
                for r in run_ranks(session=session, job_id=job_id)
                if not r.exited
            ]
            steps: dict[str, list[list[float]]] = {}
            for rec in session.scalars(
                select(StepRecord)
                .where(StepRecord.job_id == job_id)
                .order_by(StepRecord.rank, StepRecord.step)
            ):
                steps.setdefault(str(rec.rank), []).append([rec.step, rec.ts, rec.duration_s])
    finally:
        engine.dispose()
    return {
        "now": now,
        "ranks": ranks,
        "steps": {r: rows[-LAST_STEPS:] for r, rows in steps.items()},
        "groups": live.groups or {},
        "step_durations": [float(d) for d in live.step_durations],
        "expect_running": live.expect_running,
    }


def stalled_s(snap: dict[str, Any] | None, world: int) -> float:
    if snap is None or len(snap["ranks"]) < world:
        return 0.0
    done = [r["last_step_ts"] for r in snap["ranks"] if r["last_step_ts"] is not None]
    return snap["now"] - max(done) if done else 0.0


def run_case(case: Case, base: str, db_url: str, hang_s: float, timeout_s: float) -> None:
    out = OUT / case.name
    work = Path(tempfile.mkdtemp(prefix=f"pp-{case.name}-"))
    fr_dir = work / "fr" if case.style == "pairs" else None
    if fr_dir is not None:
        fr_dir.mkdir()
    log = work / "job.log"
    proc = launch(case, base, log, fr_dir)
    job = f"pipeline-{case.name}"
    try:
        deadline = time.monotonic() + timeout_s
        while stalled_s(snapshot(db_url, job, time.time()), case.ranks) < hang_s:
            if proc.poll() is not None:
                raise RuntimeError(f"{case.name}: the job exited:\n{log.read_text()[-3000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{case.name}: no hang in {timeout_s} s:\n{log.read_text()}")
            time.sleep(1.0)
        struck = [m.groups() for m in STRUCK.finditer(log.read_text())]
        if fr_dir is not None:
            (fr_dir / "TRIGGER").touch()
            gil = {int(r) for r, kind, _, _ in struck if kind == "gil"}
            want = {f"_dump_{r}" for r in range(case.ranks) if r not in gil}
            wait_until = time.monotonic() + 20
            while {p.name for p in fr_dir.glob("_dump_*")} < want:
                if time.monotonic() > wait_until:
                    raise RuntimeError(f"{case.name}: Flight Recorder dumps missing")
                time.sleep(0.2)
        snap = snapshot(db_url, job, time.time())
    finally:
        kill_tree(proc.pid)
        proc.wait()
    assert snap is not None
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    if fr_dir is not None:
        shutil.copytree(fr_dir, out / "fr", ignore=shutil.ignore_patterns("TRIGGER"))
    case_doc = {
        "case": case.name,
        "note": case.note,
        "style": case.style,
        "world_size": case.ranks,
        "stages": case.ranks // case.dp,
        "dp": case.dp,
        "layout": "rank = stage * dp + replica",
        "faults_injected": list(case.faults),
        "faults_struck": [
            {"rank": int(r), "kind": k, "step": int(s), "phase": p} for r, k, s, p in struck
        ],
        "truth": sorted({int(r) for r, _, _, _ in struck}),
        "torch": _torch_version(),
        "server": snap,
    }
    (out / "case.json").write_text(json.dumps(case_doc, indent=1) + "\n")
    shutil.rmtree(work, ignore_errors=True)
    print(f"{case.name}: truth {case_doc['truth']}, stalled {stalled_s(snap, case.ranks):.0f} s")


def _torch_version() -> str:
    import torch

    return str(torch.__version__)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", action="append", help="case name (repeatable)")
    ap.add_argument("--hang-s", type=float, default=15.0, help="record after this long stalled")
    ap.add_argument("--timeout-s", type=float, default=300.0)
    args = ap.parse_args()
    cases = [c for c in CASES if not args.only or c.name in args.only]
    with tempfile.TemporaryDirectory() as tmp:
        db_url = f"sqlite:///{tmp}/vigil.db"
        with live_server(db_url, VIGIL_SWEEP_INTERVAL_S="1") as base:
            httpx.get(f"{base}/healthz", timeout=5).raise_for_status()
            for case in cases:
                run_case(case, base, db_url, args.hang_s, args.timeout_s)


if __name__ == "__main__":
    main()
