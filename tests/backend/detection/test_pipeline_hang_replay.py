"""Recorded pipeline-parallel hangs through the server (issue 15, item 3).

Each case of ``tests/data/pipeline_hangs`` is what a real server stored of a real hung gloo
job. Here it goes in again through the ingest API (each rank's last steps, the groups'
members, its latest heartbeat with the op it is blocked in and, for a send or receive, the
peers it waits for), the sweep runs at the recorded moment, and the incident it opens must
name exactly the ranks that faulted.
"""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import select

from backend.detection.runner import sweep_job
from backend.jobs.models import Job
from tests.conftest import ADMIN, INGEST
from tests.detectors.pipeline_hang_cases import CASES, load
from tests.factories import batch


def rank_events(case: dict[str, Any], row: dict[str, Any]) -> list[dict[str, Any]]:
    """One rank's batch: its last steps, a collective per group it is in (with the members,
    as collectors report them), and its latest heartbeat."""
    server, rank = case["server"], row["rank"]
    events: list[dict[str, Any]] = [
        {"type": "step", "step": int(n), "ts": ts, "duration_s": d}
        for n, ts, d in server["steps"].get(str(rank), [])
    ]
    for group, members in server["groups"].items():
        if rank in members:
            events.append(
                {"type": "collective", "group": group, "op": "all_reduce", "duration_s": 0.001,
                 "members": members}
            )  # fmt: skip
    beat: dict[str, Any] = {"type": "heartbeat", "ts": row["last_heartbeat_ts"]}
    if row["current_step"] is not None:
        beat["step"] = row["current_step"]
    if row["inflight"]:
        beat["inflight"] = row["inflight"]
    return [*events, beat]


@pytest.mark.parametrize("name", CASES)
def test_the_sweep_names_exactly_the_faulted_ranks(name: str, client, session) -> None:  # type: ignore[no-untyped-def]
    case = load(name)
    job = f"pipeline-{name}"
    for row in case["server"]["ranks"]:
        body = batch(
            rank_events(case, row), job=job, rank=row["rank"], world_size=case["world_size"]
        )
        reply = client.post("/api/v1/ingest", json=body, headers=INGEST)
        assert reply.status_code == 200, reply.text
    job_id = session.scalar(select(Job.id).where(Job.name == job))
    sweep_job(session=session, job_id=job_id, now=case["server"]["now"])
    session.commit()
    found = client.get(f"/api/v1/jobs/{job}/incidents", headers=ADMIN).json()
    gil = any(f["kind"] == "gil" for f in case["faults_struck"])
    assert [(i["kind"], sorted(i["ranks"])) for i in found] == [
        ("crash" if gil else "hang", case["truth"])
    ]
