"""Goodput from data sent through the real ingest API, checked against hand-worked numbers."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import select

from backend.goodput.service import job_goodput
from backend.incidents.models import Incident
from backend.jobs.models import Job
from tests.conftest import ADMIN, INGEST
from tests.factories import batch

T0 = 1_732_233_000.0
JOB = "llama-8b-pretrain"


def steps(ends: list[tuple[int, float]], *, duration: float, data: float) -> list[dict[str, Any]]:
    return [
        {"type": "step", "step": n, "ts": ts, "duration_s": duration, "data_s": data}
        for n, ts in ends
    ]


def send(client, events: list[dict[str, Any]], **fields: Any) -> None:  # type: ignore[no-untyped-def]
    body = batch(events, job=fields.pop("job", JOB), world_size=2, **fields)
    reply = client.post("/api/v1/ingest", json=body, headers=INGEST)
    assert reply.status_code == 200, reply.text


def heartbeat(ts: float) -> dict[str, Any]:
    return {"type": "heartbeat", "ts": ts}


def goodput(client, job: str = JOB) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    reply = client.get(f"/api/v1/jobs/{job}/goodput", headers=ADMIN)
    assert reply.status_code == 200, reply.text
    return reply.json()  # type: ignore[no-any-return]


def job_id(session, name: str = JOB) -> int:  # type: ignore[no-untyped-def]
    return session.scalar(select(Job.id).where(Job.name == name))  # type: ignore[no-any-return]


def incident(session, kind: str, first_step: int, detected: float, **fields: Any) -> None:  # type: ignore[no-untyped-def]
    resolved = fields.pop("resolved", None)
    session.add(
        Incident(
            job_id=job_id(session, fields.pop("job", JOB)),
            kind=kind,
            fingerprint=f"{kind}:{first_step}",
            status="open" if resolved is None else "resolved",
            first_step=first_step,
            detected_at=datetime.fromtimestamp(detected, UTC),
            resolved_at=None if resolved is None else datetime.fromtimestamp(resolved, UTC),
            **fields,
        )
    )
    session.commit()


@pytest.fixture
def restarted(client) -> None:  # type: ignore[no-untyped-def]
    """Attempt 0 runs steps 0..80 (1 s slots: 0.9 s step + 0.1 s data wait before it),
    saves a 2 s checkpoint after step 50, crashes after step 80. Attempt 1 starts 60 s later
    from that checkpoint (step 51) and runs to step 99. Rank 1 reports its own, slightly
    later, timestamps: only the lowest rank's timeline is accounted."""
    a0 = [(n, T0 + n + 1 + (2 if n >= 51 else 0)) for n in range(81)]
    a1 = [(n, T0 + 143.9 + (n - 51)) for n in range(51, 100)]
    save = {
        "type": "event",
        "name": "checkpoint_saved",
        "ts": T0 + 53,
        "attrs": {"step": 50, "duration_s": 2.0, "path": "/ckpt/step-50.pt"},
    }
    loaded = {"type": "event", "name": "checkpoint_loaded", "ts": T0 + 142.5, "attrs": {"step": 50}}
    for rank, skew in ((1, 0.05), (0, 0.0)):
        shifted0 = [(n, ts + skew) for n, ts in a0]
        shifted1 = [(n, ts + skew) for n, ts in a1]
        send(client, steps(shifted0[:40], duration=0.9, data=0.1), rank=rank)
        extra = [save] if rank == 0 else []
        send(client, [*steps(shifted0[40:], duration=0.9, data=0.1), *extra], rank=rank)
        send(client, [heartbeat(T0 + 88)], rank=rank)
        send(
            client,
            [loaded, *steps(shifted1, duration=0.9, data=0.1), heartbeat(T0 + 192.4)],
            rank=rank,
            attempt=1,
        )


def test_restart_from_a_checkpoint(client, restarted) -> None:  # type: ignore[no-untyped-def]
    g = goodput(client)
    assert g["job"] == JOB
    assert g["total_s"] == pytest.approx(192.3)
    assert g["productive_s"] == pytest.approx(0.8 + 50 * 0.9 + 0.8 + 48 * 0.9)
    assert g["badput"] == pytest.approx(
        {
            "wasted_progress": 30.0,
            "disruption_recovery": 60.0,
            "between_runs": 0.0,
            "hang": 0.0,
            "straggler_slowdown": 0.0,
            "data_loading": 10.0,
            "checkpointing": 2.0,
            "other": 0.5,
        }
    )
    assert g["goodput"] == pytest.approx(89.8 / 192.3)
    assert (g["restarts"], g["steps_lost"]) == (1, 30)
    assert datetime.fromisoformat(g["as_of"]).timestamp() == pytest.approx(T0 + 192.4)
    assert sum(g["badput"].values()) + g["productive_s"] == pytest.approx(g["total_s"])


def test_as_of_an_earlier_time(client, session, restarted) -> None:  # type: ignore[no-untyped-def]
    g = job_goodput(session=session, job_id=job_id(session), now=T0 + 60.5)
    assert g is not None
    assert g["total_s"] == pytest.approx(60.4)
    assert (g["restarts"], g["steps_lost"]) == (0, 0)  # attempt 1 had not happened yet
    assert g["badput"]["checkpointing"] == pytest.approx(2.0)
    assert g["badput"]["other"] == pytest.approx(0.5)
    assert g["as_of"].timestamp() == pytest.approx(T0 + 60.5)


def test_hang_then_restart(client, session) -> None:  # type: ignore[no-untyped-def]
    # Steps 0..29, then a hang seen 20 s after the last step, killed at 30 s; the restart
    # resumes at step 30 (nothing lost) 45 s after the last step.
    send(client, steps([(n, T0 + n + 1) for n in range(30)], duration=1.0, data=0.0))
    send(client, [heartbeat(T0 + 30 + 29)])
    send(
        client,
        steps([(n, T0 + 75 + n - 29) for n in range(30, 40)], duration=1.0, data=0.0),
        attempt=1,
    )
    send(client, [heartbeat(T0 + 86)], attempt=1)
    incident(session, "hang", 30, T0 + 50, resolved=T0 + 60)
    g = goodput(client)
    assert g["total_s"] == pytest.approx(86)
    assert g["badput"]["hang"] == pytest.approx(30)
    assert g["badput"]["disruption_recovery"] == pytest.approx(15)
    assert g["productive_s"] == pytest.approx(40)
    assert g["badput"]["other"] == pytest.approx(1)


def test_open_hang_lasts_to_the_last_heartbeat(client, session) -> None:  # type: ignore[no-untyped-def]
    send(client, steps([(n, T0 + n + 1) for n in range(30)], duration=1.0, data=0.0))
    send(client, [heartbeat(T0 + 30 + 40)])
    incident(session, "hang", 30, T0 + 45)
    g = goodput(client)
    assert g["badput"]["hang"] == pytest.approx(40)
    assert g["goodput"] == pytest.approx(30 / 70)


def test_straggler_slowdown(client, session) -> None:  # type: ignore[no-untyped-def]
    # 100 steps of 1.0 s, then a straggler makes them 1.2 s for 100 steps.
    ends = [(n, T0 + n + 1) for n in range(100)]
    ends += [(n, T0 + 100 + 1.2 * (n - 99)) for n in range(100, 200)]
    send(
        client,
        [
            {"type": "step", "step": n, "ts": ts, "duration_s": 1.0 if n < 100 else 1.2}
            for n, ts in ends
        ],
    )
    incident(session, "straggler", 100, T0 + 130)
    assert goodput(client)["badput"]["straggler_slowdown"] == pytest.approx(20)


def test_resolved_straggler_ends_at_its_last_step(client, session) -> None:  # type: ignore[no-untyped-def]
    ends = [(n, T0 + n + 1) for n in range(100)]
    ends += [(n, T0 + 100 + 1.2 * (n - 99)) for n in range(100, 200)]
    send(
        client,
        [
            {"type": "step", "step": n, "ts": ts, "duration_s": 1.0 if n < 100 else 1.2}
            for n, ts in ends
        ],
    )
    incident(session, "straggler", 100, T0 + 130, resolved=T0 + 300, evidence={"last_step": 149})
    assert goodput(client)["badput"]["straggler_slowdown"] == pytest.approx(10)


def test_job_without_steps(client) -> None:  # type: ignore[no-untyped-def]
    send(client, [heartbeat(T0)])
    g = goodput(client)
    assert (g["total_s"], g["productive_s"], g["goodput"], g["steps_lost"]) == (0, 0, None, 0)
    assert set(g["badput"]) == {
        "wasted_progress",
        "disruption_recovery",
        "between_runs",
        "hang",
        "straggler_slowdown",
        "data_loading",
        "checkpointing",
        "other",
    }


def test_unknown_job_and_auth(client) -> None:  # type: ignore[no-untyped-def]
    reply = client.get("/api/v1/jobs/nope/goodput", headers=ADMIN)
    assert reply.status_code == 404
    assert "nope" in reply.json()["detail"]
    assert client.get("/api/v1/jobs/nope/goodput").status_code == 401
    assert client.get("/api/v1/jobs/nope/goodput", headers=INGEST).status_code == 403
