"""Charts over many steps read the rollups: the same numbers as from the raw rows where
the bins line up, every step counted (no sampling), the straggler still stands out."""

from __future__ import annotations

import pytest

from backend.jobs import service as jobs
from backend.telemetry import binning, queries
from tests.frontend.helpers import JOB, ingest_job


@pytest.fixture
def job_id(client, session):  # type: ignore[no-untyped-def]
    ingest_job(client, ranks=4, steps=range(128), slow_rank=2, slow_from=64)
    found = jobs.get_job_id(session=session, name=JOB)
    assert found is not None
    return found


def both(monkeypatch, read):  # type: ignore[no-untyped-def]
    """``read()`` from the raw rows, then from the rollups."""
    raw = read()
    monkeypatch.setattr(binning, "RAW_BUDGET", 0)
    return raw, read()


@pytest.mark.parametrize("agg", ["avg", "max"])
def test_heatmap_from_rollups_equals_raw(session, job_id, monkeypatch, agg):
    raw, rolled = both(
        monkeypatch,
        lambda: queries.heatmap(session=session, job_id=job_id, max_ranks=2, max_steps=8, agg=agg),
    )
    assert rolled["rollup"] == 16 and "rollup" not in raw
    assert (rolled["x"], rolled["y"], rolled["step_bin"]) == (raw["x"], raw["y"], raw["step_bin"])
    for r_row, raw_row in zip(rolled["z"], raw["z"], strict=True):
        assert r_row == pytest.approx(raw_row)


def test_series_and_memory_from_rollups_equal_raw(session, job_id, monkeypatch):
    raw, rolled = both(
        monkeypatch, lambda: queries.series(session=session, job_id=job_id, max_steps=4)
    )
    assert (rolled["rollup"], rolled["step_bin"]) == (16, 32)
    assert rolled["step"] == raw["step"] == [0, 32, 64, 96]
    for key in ("step_time", "step_time_max", "loss"):
        assert rolled[key] == pytest.approx(raw[key])
    assert rolled["memory"]["step"] == raw["memory"]["step"]
    assert rolled["memory"]["max_bytes"] == raw["memory"]["max_bytes"]


def test_straggler_stands_out_in_rollups(session, job_id, monkeypatch):
    monkeypatch.setattr(binning, "RAW_BUDGET", 0)
    out = queries.heatmap(session=session, job_id=job_id, max_ranks=4, max_steps=12)
    assert out["rollup"] == 16 and out["sampled_steps_per_bin"] is None
    late = [row[-1] for row in out["z"]]
    assert max(range(4), key=lambda r: late[r]) == 2
    assert late[2] > 1.3 * sorted(late)[1]


def test_steps_stored_from_rollups(session, job_id):
    assert jobs.steps_stored(session=session, job_id=job_id) == 4 * 128


def test_bandwidth_from_rollups_equals_raw(session, job_id, monkeypatch):
    raw, rolled = both(
        monkeypatch, lambda: queries.bandwidth(session=session, job_id=job_id, max_steps=4)
    )
    assert rolled["rollup"] == 16 and rolled["step_bin"] == raw["step_bin"] == 32
    assert [g["group"] for g in rolled["groups"]] == [g["group"] for g in raw["groups"]] == ["dp"]
    [r], [w] = rolled["groups"], raw["groups"]
    assert r["step"] == w["step"] and r["bytes_per_s"] == pytest.approx(w["bytes_per_s"])


def test_collective_rollups_kept_by_ingest_equal_a_rebuild(session, job_id):
    from sqlalchemy import select

    from backend.telemetry.models import CollectiveRollup
    from backend.telemetry.rollups import rebuild_collective_rollups

    def table() -> list[tuple]:  # type: ignore[type-arg]
        r = CollectiveRollup
        rows = session.execute(
            select(r.level, r.bin, r.rank, r.group, r.n, r.sum_bytes, r.sum_seconds)
            .where(r.job_id == job_id)
            .order_by(r.level, r.bin, r.rank, r.group)
        )
        return [tuple(row) for row in rows]

    kept = table()
    assert len(kept) == 4 * (8 + 2 + 1 + 1 + 1)  # ranks x bins of 16, 64, 256, 1024, 4096
    rebuild_collective_rollups(session=session, job_id=job_id)
    rebuilt = table()
    assert [k[:5] for k in kept] == [k[:5] for k in rebuilt]
    flat = [v for k in kept for v in k[5:]]
    assert flat == pytest.approx([v for k in rebuilt for v in k[5:]])


def test_bandwidth_of_huge_byte_counts_does_not_overflow(client, session):
    # Two collectives of 2**62 bytes in one bin: an integer sum() overflows 64 bits.
    from tests.conftest import INGEST
    from tests.factories import batch, step

    events = [
        {"type": "collective", "step": 1, "group": "dp", "op": "all_reduce", "seq": i,
         "bytes": 2**62, "duration_s": 1.0, "count": 1}
        for i in range(2)
    ] + [step(n) for n in range(3)]  # fmt: skip
    reply = client.post("/api/v1/ingest", json=batch(events, job="huge-bytes"), headers=INGEST)
    assert reply.status_code == 200, reply.text
    job_id = jobs.get_job_id(session=session, name="huge-bytes")
    out = queries.bandwidth(session=session, job_id=job_id, max_steps=4)
    [group] = out["groups"]
    assert group["bytes_per_s"] == [pytest.approx(2**62)]
