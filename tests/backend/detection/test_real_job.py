"""The whole path on a real job: a 3-rank DDP job over gloo under torchrun, faults injected
with VIGIL_CHAOS, a real server detecting in its background loop; incidents read over REST."""

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
EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "train_tiny_gpt.py"
FAST_DETECTION = {"VIGIL_DETECT_INTERVAL_S": "0.5", "VIGIL_SWEEP_INTERVAL_S": "0.5"}


def launch(base: str, job: str, steps: int, chaos: str) -> subprocess.Popen[str]:
    command = [
        sys.executable,
        "-m",
        "backend",
        "run",
        "--job",
        job,
        "--endpoint",
        base,
        "--token",
        "vigil-dev-ingest",
        "--chaos",
        chaos,
        "--",
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "3",
        str(EXAMPLE),
        "--dim",
        "32",
        "--layers",
        "1",
        "--seq",
        "32",
        "--steps",
        str(steps),
    ]
    env = {**os.environ, "VIGIL_HEARTBEAT_S": "0.25", "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        command,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def incidents(base: str, job: str) -> list[dict]:
    reply = httpx.get(f"{base}/api/v1/jobs/{job}/incidents", headers=ADMIN, timeout=10)
    return reply.json() if reply.status_code == 200 else []


def wait_for(base: str, job: str, kinds: set[str], timeout: float) -> list[dict]:
    deadline = time.monotonic() + timeout
    while True:
        found = incidents(base, job)
        if kinds <= {i["kind"] for i in found} or time.monotonic() > deadline:
            return found
        time.sleep(0.5)


@pytest.mark.slow
def test_straggler_and_nan_in_a_real_job(sqlite_url):
    job = "chaos-straggler-nan"
    with live_server(sqlite_url, **FAST_DETECTION) as base:
        proc = launch(base, job, 70, "straggler:rank=2,from_step=15,delay_s=0.2;nan:at_step=50")
        out, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, out
        found = wait_for(base, job, {"straggler", "nan"}, timeout=30)
    by_kind: dict[str, list[dict]] = {}
    for incident in found:
        by_kind.setdefault(incident["kind"], []).append(incident)
    assert len(by_kind.get("straggler", [])) == 1, found  # deduplicated
    [straggler] = by_kind["straggler"]
    assert straggler["ranks"] == [2]
    # Onset: the first step of the persistent run, which on a loaded 2-core machine can take
    # in a noisy step or two just before the fault; the issue asks for <= 10 steps after.
    assert 10 <= straggler["first_step"] <= 25
    assert len(by_kind.get("nan", [])) == 1, found
    assert 50 <= by_kind["nan"][0]["first_step"] <= 52
    assert set(by_kind) <= {"straggler", "nan", "slowdown"}, [
        (i["kind"], i["summary"], i["evidence"]) for i in found
    ]


@pytest.mark.slow
def test_hang_in_a_real_job_names_the_hung_rank(sqlite_url):
    job = "chaos-hang"
    with live_server(sqlite_url, **FAST_DETECTION) as base:
        proc = launch(base, job, 10_000, "hang:rank=1,at_step=12")
        try:
            found = wait_for(base, job, {"hang"}, timeout=120)
        finally:
            kill_tree(proc.pid)
            proc.wait()
    hangs = [i for i in found if i["kind"] == "hang"]
    assert len(hangs) == 1, found
    assert hangs[0]["ranks"] == [1], (hangs[0]["summary"], hangs[0]["evidence"])
    assert hangs[0]["first_step"] == 12
