"""The rank × step heatmap: binned in SQL, never more cells than asked, right averages."""

from __future__ import annotations

import pytest

from backend.jobs.models import Job
from backend.telemetry import binning, queries
from backend.telemetry.binning import Bins
from backend.telemetry.models import StepRecord
from tests.frontend.helpers import ingest_job


def known_job(session, ranks=3, steps=10):  # type: ignore[no-untyped-def]
    """duration = 1 + step/100 + rank, comm = 0.5 (rank 2: unknown)."""
    job = Job(name="grid", world_size=ranks)
    session.add(job)
    session.flush()
    session.add_all(
        StepRecord(
            job_id=job.id,
            rank=r,
            step=s,
            ts=float(s),
            duration_s=1 + s / 100 + r,
            comm_s=None if r == 2 else 0.5,
        )
        for r in range(ranks)
        for s in range(steps)
    )
    session.flush()
    return job


def compute(rank: int, step: int) -> float:
    return 1 + step / 100 + rank - (0 if rank == 2 else 0.5)


def test_bins_average_compute_time(session):
    job = known_job(session)
    out = queries.heatmap(session=session, job_id=job.id, max_ranks=2, max_steps=5)
    assert (out["step_bin"], out["rank_bin"]) == (2, 2)
    assert out["x"] == [0, 2, 4, 6, 8] and out["y"] == [0, 2]
    assert len(out["z"]) == 2 and all(len(row) == 5 for row in out["z"])
    for i, r0 in enumerate(out["y"]):
        for j, s0 in enumerate(out["x"]):
            cells = [compute(r, s) for r in range(r0, min(r0 + 2, 3)) for s in range(s0, s0 + 2)]
            assert out["z"][i][j] == pytest.approx(sum(cells) / len(cells))
    assert out["sampled_steps_per_bin"] is None


def test_never_more_cells_than_asked(session):
    job = known_job(session, ranks=7, steps=23)
    for max_ranks, max_steps in [(1, 1), (2, 3), (3, 7), (7, 23), (100, 100)]:
        out = queries.heatmap(
            session=session, job_id=job.id, max_ranks=max_ranks, max_steps=max_steps
        )
        assert len(out["z"]) <= max_ranks and all(len(r) <= max_steps for r in out["z"])
        assert all(v is not None for row in out["z"] for v in row)


def test_max_and_step_range(session):
    job = known_job(session)
    out = queries.heatmap(
        session=session, job_id=job.id, max_ranks=10, max_steps=2, from_step=4, to_step=7, agg="max"
    )
    assert out["x"] == [4, 6] and out["y"] == [0, 1, 2]
    assert out["z"][0] == pytest.approx([compute(0, 5), compute(0, 7)])


def test_large_jobs_are_sampled_by_steps(session, monkeypatch):
    monkeypatch.setattr(binning, "ROW_BUDGET", 12)
    job = known_job(session, ranks=3, steps=10)
    out = queries.heatmap(session=session, job_id=job.id, max_ranks=3, max_steps=2)
    # 30 rows > 12: each 5-step bin is represented by 2 evenly spaced steps (0, 2 and 5, 7).
    assert out["sampled_steps_per_bin"] == 2
    assert out["z"][1] == pytest.approx(
        [(compute(1, 0) + compute(1, 2)) / 2, (compute(1, 5) + compute(1, 7)) / 2]
    )


def test_bin_plan():
    plan = Bins.plan(0, 9_999, 500, ranks=1024)
    assert (plan.width, plan.count) == (20, 500)
    assert plan.sample is not None and len(plan.sample) == 500  # one step per bin
    assert all(s % 20 == 0 for s in plan.sample)
    assert Bins.plan(0, 99, 500, ranks=8).sample is None  # small: every row


def test_straggler_row_stands_out(client):
    ingest_job(client)  # rank 2 of 4 turns slow at step 50
    out = client.get("/api/v1/jobs/llama-8b-pretrain/heatmap?max_ranks=4&max_steps=12").json()
    late = [row[-1] for row in out["z"]]  # the last step bin, after the onset
    assert max(range(4), key=lambda r: late[r]) == 2
    assert late[2] > 1.3 * sorted(late)[1]
