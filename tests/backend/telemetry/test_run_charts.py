"""The job page's charts for one run of a job (issue 17: "evidence people can read"): a job
name launched again is a new run, and the step-time, loss, memory, heatmap and bandwidth
charts can be read for one run (``?run=N``), so two runs can be compared step for step.

Seen before: the charts binned a job's steps by step number whatever the run, so a second
launch of the same name drew both runs' step 0-49 as one line (their mean); nothing could
show the runs apart or side by side.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from backend.incidents.service import apply_findings
from backend.jobs import service as jobs
from backend.telemetry import binning
from detectors.finding import Finding
from tests.conftest import ADMIN, INGEST
from tests.factories import batch, step

JOB = "two-runs"
STEP_S = {1: 0.2, 2: 0.5}  # run number → its step time (s)
LOSS = {1: 3.0, 2: 1.5}
CHARTS = ("series", "heatmap", "bandwidth")


def launch(client: Any, number: int, *, steps: int = 50, ranks: int = 2) -> None:
    """Run ``number`` of the job: ``steps`` steps on each rank (collectives included), then
    a clean goodbye, so the next launch is the job's next run."""
    now = time.time()
    for rank in range(ranks):
        events: list[dict[str, Any]] = []
        for n in range(steps):
            events.append(
                step(
                    n,
                    ts=now - steps + n,
                    duration_s=STEP_S[number],
                    comm_s=0.05,
                    loss=LOSS[number],
                    mem_bytes=1_000_000 * number,
                )
            )
            events.append(
                {
                    "type": "collective",
                    "step": n,
                    "group": "dp",
                    "op": "all_reduce",
                    "bytes": 1_000_000 * number,
                    "duration_s": 0.01,
                    "count": 1,
                }
            )
        events.append({"type": "heartbeat", "ts": now, "step": steps})
        send(client, events, rank=rank, world_size=ranks, run=f"launch-{number}")
    for rank in range(ranks):
        beat = {"type": "heartbeat", "ts": now + 1, "exiting": True, "exit_code": 0}
        send(client, [beat], rank=rank, world_size=ranks, run=f"launch-{number}")


def send(client: Any, events: list[dict[str, Any]], **fields: Any) -> None:
    reply = client.post("/api/v1/ingest", json=batch(events, job=JOB, **fields), headers=INGEST)
    assert reply.status_code == 200, reply.text


@pytest.fixture
def two_runs(client: Any) -> Any:
    """The job launched twice, steps 0-49 each time: run 1 at 0.2 s a step, run 2 at 0.5 s."""
    for number in (1, 2):
        launch(client, number)
    runs = client.get(f"/api/v1/jobs/{JOB}/runs", headers=ADMIN).json()
    assert [r["number"] for r in runs] == [2, 1]
    return client


def chart(client: Any, name: str, **params: Any) -> Any:
    reply = client.get(f"/api/v1/jobs/{JOB}/{name}", params=params, headers=ADMIN)
    assert reply.status_code == 200, reply.text
    return reply.json()


def test_series_of_one_run_holds_only_its_steps(two_runs):
    for number in (1, 2):
        out = chart(two_runs, "series", run=number)
        assert out["run"] == number
        assert out["step"] == list(range(50))
        assert set(out["step_time"]) == {STEP_S[number]}
        assert set(out["loss"]) == {LOSS[number]}
        assert set(out["memory"]["max_bytes"]) == {1_000_000 * number}
    # Without ?run= the whole job, as before: both runs at each step.
    everything = chart(two_runs, "series")
    assert "run" not in everything
    assert everything["step_time"][0] == pytest.approx((STEP_S[1] + STEP_S[2]) / 2)


def test_heatmap_and_bandwidth_of_one_run(two_runs):
    for number in (1, 2):
        heat = chart(two_runs, "heatmap", run=number)
        assert heat["run"] == number and heat["ranks"] == 2
        compute = [v for row in heat["z"] for v in row]
        assert compute == pytest.approx([STEP_S[number] - 0.05] * 100)  # 2 ranks × 50 steps
        [dp] = chart(two_runs, "bandwidth", run=number)["groups"]
        assert set(dp["bytes_per_s"]) == {1e8 * number}  # bytes ÷ 0.01 s


def test_each_run_marks_its_own_incidents(two_runs, session):
    job_id = jobs.require_job_id(session=session, name=JOB)
    finding = Finding(
        kind="straggler",
        severity="warning",
        ranks=(1,),
        first_step=10,
        score=2.0,
        summary="rank 1 is slow",
        key="straggler:1",
    )
    apply_findings(session=session, job_id=job_id, findings=[finding], covered_kinds=[])
    session.commit()
    [mark] = chart(two_runs, "series", run=2)["incidents"]
    assert (mark["kind"], mark["run"]) == ("straggler", 2)
    assert chart(two_runs, "series", run=1)["incidents"] == []
    [overview_mark] = chart(two_runs, "overview")["incidents"]
    assert overview_mark["run"] == 2  # the live page tells each mark's run


@pytest.mark.parametrize("name", CHARTS)
@pytest.mark.parametrize(
    ("run", "status", "says"),
    [
        ("abc", 422, "query.run"),
        ("1.5", 422, "query.run"),
        ("0", 422, "query.run"),
        ("3", 404, "job 'two-runs' has no run 3"),
    ],
)
def test_a_run_that_is_not_one_is_a_clear_4xx(two_runs, name, run, status, says):
    reply = two_runs.get(f"/api/v1/jobs/{JOB}/{name}", params={"run": run}, headers=ADMIN)
    assert reply.status_code == status, reply.text
    assert says in reply.text


def test_one_run_of_several_reads_raw_rows_not_the_job_wide_rollups(two_runs, monkeypatch):
    monkeypatch.setattr(binning, "RAW_BUDGET", 0)  # big-job path: rollups where they fit
    assert "rollup" in chart(two_runs, "series")  # the whole job: its rollups
    out = chart(two_runs, "series", run=1)  # rollups sum both runs: raw rows of run 1
    assert "rollup" not in out and set(out["step_time"]) == {STEP_S[1]}


def test_the_only_run_of_a_job_still_reads_its_rollups(client, monkeypatch):
    launch(client, 1)
    monkeypatch.setattr(binning, "RAW_BUDGET", 0)
    out = chart(client, "series", run=1)
    assert out["run"] == 1 and out["rollup"] == 16
    assert set(out["step_time"]) == {STEP_S[1]}
