"""Step rollups kept by ingest: the same sums as recomputing them from the steps, every
level, across batches that share bins, with missing and non-finite values, retries once."""

from __future__ import annotations

import json
import math

import pytest
from sqlalchemy import func, select

from backend.jobs.models import Job
from backend.telemetry.models import ROLLUP_WIDTHS, StepRollup
from backend.telemetry.rollups import rebuild_rollups
from tests.conftest import INGEST
from tests.factories import batch, step

FIELDS = [c.name for c in StepRollup.__table__.columns if c.name not in ("job_id",)]


def rollups(session, job_id: int) -> list[tuple]:  # type: ignore[no-untyped-def, type-arg]
    session.expire_all()
    rows = session.scalars(
        select(StepRollup)
        .where(StepRollup.job_id == job_id)
        .order_by(StepRollup.level, StepRollup.bin, StepRollup.rank)
    )
    return [tuple(getattr(r, f) for f in FIELDS) for r in rows]


def odd_step(n: int) -> dict:  # type: ignore[type-arg]
    """Steps whose loss, comm and memory are sometimes missing or non-finite."""
    fields: dict = {"duration_s": 0.3 + (n % 7) / 100}  # type: ignore[type-arg]
    if n % 5 == 0:
        fields["comm_s"] = None
    if n % 11 == 0:
        fields["loss"] = math.nan
    elif n % 13 == 0 or n == 1:
        fields["loss"] = None
    if n % 3 == 0:
        fields["mem_bytes"] = None
    else:
        fields["mem_bytes"] = 1_000 + n
    return step(n, **fields)


def test_ingest_keeps_what_a_rebuild_computes(client, session):
    sent = [
        batch([odd_step(n) for n in range(0, 300)], rank=0),
        batch([odd_step(n) for n in range(300, 1100)], rank=0),  # bins shared with the first
        batch([odd_step(n) for n in range(40, 700)], rank=1),
        batch([odd_step(n) for n in range(5000, 5003)], rank=0),
    ]
    # Python's json writes the NaN literal the collector sends.
    headers = {**INGEST, "Content-Type": "application/json"}
    for body in sent:
        reply = client.post("/api/v1/ingest", content=json.dumps(body), headers=headers)
        assert reply.status_code == 200, reply.text
    # A retry is not counted twice.
    again = client.post("/api/v1/ingest", content=json.dumps(sent[1]), headers=headers)
    assert again.json()["duplicate"]

    job_id = session.scalar(select(Job.id))
    kept = rollups(session, job_id)
    rebuild_rollups(session=session, job_id=job_id)
    rebuilt = rollups(session, job_id)
    assert [r[:3] for r in kept] == [r[:3] for r in rebuilt]  # level, bin, rank
    for a, b in zip(kept, rebuilt, strict=True):
        assert a == pytest.approx(b)

    by_level = dict(
        session.execute(
            select(StepRollup.level, func.sum(StepRollup.n))
            .where(StepRollup.job_id == job_id)
            .group_by(StepRollup.level)
        ).all()
    )
    assert by_level == {level: 300 + 800 + 660 + 3 for level in range(len(ROLLUP_WIDTHS))}
    # Rank 0, level 0, bin 0: steps 0..15 of the first batch.
    first = next(r for r in kept if r[:3] == (0, 0, 0))
    row = dict(zip(FIELDS, first, strict=True))
    assert row["n"] == 16 and row["n_nonfinite_loss"] == 2  # steps 0 and 11 are NaN
    assert row["n_loss"] == 16 - 2 - 2  # steps 1 and 13 have none
    assert row["max_mem"] == 1_000 + 14
    assert row["max_duration"] == pytest.approx(0.36)
