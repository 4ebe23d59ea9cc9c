"""Detection runs over stored data: the window detectors after ingest, the sweep for
silent jobs. Data goes in through the ingest API; incidents come out of the REST API."""

from __future__ import annotations

import numpy as np
from sqlalchemy import select

from backend.detection.runner import detect_job, sweep_job
from backend.jobs.models import Job
from tests.conftest import ADMIN, INGEST
from tests.factories import batch

JOB = "llama-8b-pretrain"
T0 = 1_700_000_000.0


def post_steps(
    client,
    *,
    ranks=4,
    steps=range(120),
    slow_rank=None,
    slow_from=50,
    factor=1.4,
    inflight=None,
    beat_ts=None,
):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(0)
    for rank in range(ranks):
        events = []
        for n in steps:
            compute = 0.3 * (1 + rng.normal(0, 0.01))
            if rank == slow_rank and n >= slow_from:
                compute *= factor
            events.append(
                {
                    "type": "step",
                    "step": n,
                    "ts": T0 + n,
                    "duration_s": 0.4,
                    "comm_s": max(0.0, 0.4 - compute),
                    "loss": 2.0,
                }
            )
        beat = {"type": "heartbeat", "ts": beat_ts or T0 + max(steps) + 1, "step": max(steps) + 1}
        if inflight and rank in inflight:
            beat["inflight"] = inflight[rank]
        events.append(beat)
        reply = client.post(
            "/api/v1/ingest", json=batch(events, rank=rank, world_size=ranks), headers=INGEST
        )
        assert reply.status_code == 200, reply.text


def job_id(session):  # type: ignore[no-untyped-def]
    return session.scalar(select(Job.id).where(Job.name == JOB))


def incidents(client):  # type: ignore[no-untyped-def]
    return client.get(f"/api/v1/jobs/{JOB}/incidents", headers=ADMIN).json()


def test_straggler_becomes_one_incident_naming_the_rank(client, session):
    post_steps(client, slow_rank=2)
    for _ in range(3):  # repeated runs update, never duplicate
        detect_job(session=session, job_id=job_id(session))
        session.commit()
    found = incidents(client)
    assert len(found) == 1, [(i["kind"], i["summary"]) for i in found]
    [incident] = found
    assert (incident["kind"], incident["ranks"], incident["status"]) == ("straggler", [2], "open")
    assert 50 <= incident["first_step"] <= 60


def test_clean_job_opens_nothing(client, session):
    post_steps(client)
    changes = detect_job(session=session, job_id=job_id(session))
    assert not changes
    assert incidents(client) == []


def test_sweep_names_the_rank_that_never_entered_the_collective(client, session):
    waiting = {"group": "world", "op": "all_reduce", "seq": 500, "since": T0 + 120}
    post_steps(client, ranks=4, inflight={0: waiting, 1: waiting, 3: waiting}, beat_ts=T0 + 200)
    # 80 s without progress, heartbeats fresh: far past 5 x 0.4 s (the floor is 10 s).
    sweep_job(session=session, job_id=job_id(session), now=T0 + 200.5)
    session.commit()
    [incident] = incidents(client)
    assert (incident["kind"], incident["ranks"]) == ("hang", [2])
    assert incident["severity"] == "critical"


def test_sweep_finds_a_crashed_rank(client, session):
    post_steps(client, ranks=4, beat_ts=T0 + 121)
    # Ranks 0, 1, 3 keep sending heartbeats; rank 2 went silent.
    for rank in (0, 1, 3):
        client.post(
            "/api/v1/ingest",
            json=batch(
                [{"type": "heartbeat", "ts": T0 + 160, "step": 121}], rank=rank, world_size=4
            ),
            headers=INGEST,
        )
    sweep_job(session=session, job_id=job_id(session), now=T0 + 160.5)
    session.commit()
    [incident] = incidents(client)
    assert (incident["kind"], incident["ranks"]) == ("crash", [2])


def test_healthy_job_sweeps_clean(client, session):
    post_steps(client, ranks=2)
    changes = sweep_job(session=session, job_id=job_id(session), now=T0 + 121.5)
    assert not changes


def test_nan_loss_opens_a_critical_incident(client, session):
    import json

    events = [
        {
            "type": "step",
            "step": n,
            "ts": T0 + n,
            "duration_s": 0.4,
            "loss": float("nan") if n >= 30 else 2.0,
        }
        for n in range(40)
    ]
    for rank in range(2):
        body = json.dumps(batch(events, rank=rank, world_size=2))  # NaN literals, as Python sends
        client.post(
            "/api/v1/ingest", content=body, headers={**INGEST, "Content-Type": "application/json"}
        )
    detect_job(session=session, job_id=job_id(session))
    session.commit()
    [incident] = incidents(client)
    assert (incident["kind"], incident["severity"], incident["first_step"]) == (
        "nan",
        "critical",
        30,
    )
