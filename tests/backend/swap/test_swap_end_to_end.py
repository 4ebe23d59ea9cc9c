"""Issue 14's loop end to end: a real 2-rank gloo job (``examples/train_tiny_gpt.py``) changes
its sequence length from 64 to 128 at step 40 under a memory budget that the longer step does
not fit unmodified (``backend.demo.swap_drift``, the scenario of ``vigil demo --swap``).
A real ``vigil server`` sees the drift (``opseq_change``), makes a policy from the profile the
ranks shipped, pushes it (``apply_swap_policy``), both ranks apply it at their next step,
and their step records report that version and a measured peak within the budget.

On CUDA (when there is a device) the same job trains on the GPU: pinned host buffers and a
side stream for the copies (``collector/integrations/swap_cuda.py``)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from backend.db import make_engine
from backend.demo.swap_drift import (
    DriftScenario,
    Seen,
    launch,
    memory_budget,
    modelled_peaks,
    observe,
)
from backend.jobs.models import Job
from backend.telemetry.models import StepRecord
from tests.conftest import ADMIN
from tests.servers import kill_tree, live_server

torch = pytest.importorskip("torch")
JOB = "swap-drift-e2e"
FAST = {"VIGIL_DETECT_INTERVAL_S": "0.5", "VIGIL_SWEEP_INTERVAL_S": "0.5"}
NO_CUDA = (
    "no CUDA device here: the swap executor's CUDA path (pinned buffers, side stream) is not run"
)


def run_until_applied(base: str, sc: DriftScenario, budget: int, log: Path) -> tuple[Seen, str]:
    """Run the job until both ranks run the policy and a few steps report it; stop it."""
    with log.open("wb") as out:
        proc = launch(base=base, token="vigil-dev-ingest", job=JOB, scenario=sc, budget=budget,
                      log=out)  # fmt: skip
    seen = Seen()
    try:
        with httpx.Client(base_url=f"{base}/api/v1", headers=ADMIN, timeout=10) as api:
            deadline = time.monotonic() + 50
            while time.monotonic() < deadline and proc.poll() is None:
                seen = observe(api, JOB)
                if seen.applied(sc.ranks):
                    time.sleep(1)  # a few more steps under the policy
                    break
                time.sleep(0.5)
            seen = observe(api, JOB)
    finally:
        kill_tree(proc.pid)
        proc.wait()
    return seen, log.read_text(errors="replace")[-4000:]


def step_rows(db_url: str) -> list[Any]:
    engine = make_engine(db_url)
    try:
        with engine.connect() as conn:
            job_id = conn.scalar(select(Job.id).where(Job.name == JOB))
            return list(
                conn.execute(
                    select(
                        StepRecord.rank,
                        StepRecord.step,
                        StepRecord.swap_policy,
                        StepRecord.swap_peak_bytes,
                        StepRecord.opseq,
                        StepRecord.mem_bytes,
                    )
                    .where(StepRecord.job_id == job_id)
                    .order_by(StepRecord.rank, StepRecord.step)
                )
            )
    finally:
        engine.dispose()


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "device",
    [
        "cpu",
        pytest.param(
            "cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA)
        ),
    ],
)
def test_a_drifting_job_gets_a_swap_policy_and_its_steps_run_it(sqlite_url, tmp_path, device):
    sc = DriftScenario(steps=5000, device=device)  # stopped once the loop has closed
    peaks = modelled_peaks(sc)
    budget = memory_budget(sc, peaks)
    with live_server(sqlite_url, **FAST) as base:
        seen, log = run_until_applied(base, sc, budget, tmp_path / "job.log")
        state = f"{seen}\n{log}"

        # 1. The drift is an incident that starts within 10 steps of the change.
        incident = seen.incident
        assert incident is not None, state
        assert sc.change_at <= incident["first_step"] <= sc.change_at + 10, incident
        shape = incident["evidence"]["to_shape_fp"]

        # 2. A policy for the new shape was pushed, and both ranks took it.
        action = seen.action
        assert action is not None and action["kind"] == "apply_swap_policy", state
        assert action["params"]["shape_fp"] == shape
        version = seen.version
        assert version is not None and seen.offloaded > 0, action["params"]
        assert action["state"] == "succeeded", action
        assert set(action["deliveries"]) == {str(r) for r in range(sc.ranks)}, action
        assert seen.applied(sc.ranks), state
        from_step = {rank: r["from_step"] for rank, r in seen.results.items()}
        assert all(r["version"] == version for r in seen.results.values()), seen.results
        assert all(s > sc.change_at for s in from_step.values()), from_step

        # 3. The backend saw it applied, and the measured peak keeps to the budget.
        policy = seen.policy
        assert policy is not None and policy["state"] == "applied", policy
        assert policy["budget_bytes"] < budget and policy["feasible"], policy
        assert policy["measured_peak_bytes"] <= policy["budget_bytes"], policy

    # 4. Every step from the one each rank applied it at reports it (a sampled op-sequence
    # capture step runs without it: it carries ``opseq``), none before does. On CPU, until
    # then the executor's account (mem_bytes) is what the simulator models for the
    # unmodified step: within the budget at 64, over it at 128. (On CUDA mem_bytes is the
    # allocator's peak, which may already press at 64 and bring a policy for that shape.)
    rows = step_rows(sqlite_url)
    for rank in range(sc.ranks):
        mine = [r for r in rows if r.rank == rank]
        before = [r for r in mine if r.step < from_step[rank]]
        after = [r for r in mine if r.step >= from_step[rank] and r.opseq is None]
        assert before and all(r.swap_policy != version for r in before), rank
        if device == "cpu":
            assert all(r.swap_policy is None for r in before), rank
            short = {r.mem_bytes for r in before if 0 < r.step < sc.change_at and not r.opseq}
            long = {r.mem_bytes for r in before if r.step > sc.change_at + 1 and not r.opseq}
            assert short == {peaks[sc.short]["peak"]} and long == {peaks[sc.long]["peak"]}
            assert peaks[sc.short]["peak"] < budget < peaks[sc.long]["peak"]
        assert len(after) >= 3, (rank, after)
        assert all(r.swap_policy == version for r in after), (rank, after)
        assert all(r.swap_peak_bytes <= policy["budget_bytes"] for r in after), (rank, after)
