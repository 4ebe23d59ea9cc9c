"""Real multi-process training: a 2-rank DDP job over gloo under torchrun, launched with
``vigil run``, reporting to a real server."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import ADMIN
from tests.servers import kill_tree, live_server

pytest.importorskip("torch")
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_tiny_gpt.py"
JOB = "tiny-gpt"


def vigil_run(
    base: str, *script_args: str, chaos: str | None = None, **env: str
) -> subprocess.Popen[str]:
    command = [
        sys.executable,
        "-m",
        "backend",
        "run",
        "--job",
        JOB,
        "--endpoint",
        base,
        "--token",
        "vigil-dev-ingest",
    ]
    if chaos:
        command += ["--chaos", chaos]
    command += [
        "--",
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        str(EXAMPLE),
        "--dim",
        "64",
        *script_args,
    ]
    full_env = {**os.environ, "VIGIL_HEARTBEAT_S": "0.2", "OMP_NUM_THREADS": "1", **env}
    return subprocess.Popen(
        command,
        env=full_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def get(base: str, path: str):  # type: ignore[no-untyped-def]
    return httpx.get(f"{base}/api/v1/jobs/{JOB}{path}", headers=ADMIN, timeout=10).json()


def finish(proc: subprocess.Popen[str], timeout: float = 240) -> str:
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            kill_tree(proc.pid)
    return out


@pytest.mark.slow
def test_ddp_job_reports_steps_collectives_and_op_sequences(sqlite_url):
    from sqlalchemy import func, select

    from backend.db import make_engine
    from backend.telemetry.models import CollectiveRecord, OpSequence

    with live_server(sqlite_url) as base:
        proc = vigil_run(base, "--steps", "12")
        out = finish(proc)
        assert proc.returncode == 0, out
        steps = get(base, "/steps?limit=1000")["items"]
        assert sorted((s["rank"], s["step"]) for s in steps) == [
            (r, n) for r in (0, 1) for n in range(12)
        ]
        assert all(s["loss"] is not None and s["grad_norm"] is not None for s in steps)
        assert all(s["comm_s"] > 0 for s in steps), "DDP gradient all-reduce was not timed"
        ranks = get(base, "/ranks")
        assert [r["rank"] for r in ranks] == [0, 1]
    engine = make_engine(sqlite_url)
    with engine.connect() as conn:
        ops = conn.execute(
            select(CollectiveRecord.op, func.sum(CollectiveRecord.count)).group_by(
                CollectiveRecord.op
            )
        ).all()
        opseqs = conn.scalar(select(func.count()).select_from(OpSequence))
    engine.dispose()
    assert "all_reduce" in dict(ops)
    assert opseqs >= 1  # step 0 is sampled by default


@pytest.mark.slow
def test_unmarked_script_gets_steps_from_the_optimizer_hook(sqlite_url):
    with live_server(sqlite_url) as base:
        proc = vigil_run(base, "--steps", "10", "--no-step-marks")
        out = finish(proc)
        assert proc.returncode == 0, out
        steps = get(base, "/steps?limit=1000")["items"]
        # The first optimizer step only starts step 0; the last one is closed at exit.
        per_rank = {r: sorted(s["step"] for s in steps if s["rank"] == r) for r in (0, 1)}
        assert per_rank[0] == per_rank[1] == list(range(len(per_rank[0])))
        assert len(per_rank[0]) >= 9


@pytest.mark.slow
def test_hang_heartbeats_show_who_waits_in_which_collective(sqlite_url):
    with live_server(sqlite_url) as base:
        proc = vigil_run(base, "--steps", "1000", chaos="hang:rank=1,at_step=6")
        try:
            deadline = time.monotonic() + 150
            while True:
                assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
                assert time.monotonic() < deadline, "never saw the hang"
                ranks = {r["rank"]: r for r in get(base, "/ranks")} if _has_job(base) else {}
                waiting, hung = ranks.get(0), ranks.get(1)
                if (
                    waiting
                    and hung
                    and waiting["inflight"]
                    and hung["current_step"] == 6
                    and waiting["heartbeat_age_s"] < 2
                    and hung["heartbeat_age_s"] < 2
                ):
                    break
                time.sleep(0.3)
            # Rank 0 sits in step 6's first collective (DDP broadcasts the model's buffers
            # before the forward pass, then all-reduces gradients); rank 1 never entered it.
            assert waiting["inflight"]["op"] in ("broadcast", "all_reduce")
            assert waiting["current_step"] == 6
            assert hung["inflight"] is None
            time.sleep(1.0)
            later = {r["rank"]: r for r in get(base, "/ranks")}
            assert later[0]["last_heartbeat_ts"] > waiting["last_heartbeat_ts"]  # still flowing
        finally:
            kill_tree(proc.pid)
            proc.wait()


def _has_job(base: str) -> bool:
    return httpx.get(f"{base}/api/v1/jobs/{JOB}", headers=ADMIN).status_code == 200
