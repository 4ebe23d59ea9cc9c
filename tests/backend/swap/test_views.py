"""``GET /api/v1/jobs/{job}/swap``: fingerprints over steps, policies, the active one."""

from __future__ import annotations

from backend.auth.service import create_token
from backend.swap.loop import run_swap_loop
from tests.backend.recovery.helpers import make_incident
from tests.backend.swap.helpers import (
    JOB,
    MIB,
    OPSEQ_A,
    OPSEQ_B,
    SHAPE_A,
    SHAPE_B,
    job_of,
    opseq_event,
    run,
    start_job,
    steps,
)
from tests.conftest import ADMIN, INGEST

URL = f"/api/v1/jobs/{JOB}/swap"


def test_swap_shows_fingerprints_policies_and_the_active_version(client, session, settings):
    start_job(client)  # shape A from step 0: aten::mm, aten::relu
    gelu = ("mm", "gelu")
    run(client, [*steps(range(20, 28), SHAPE_B, captured=OPSEQ_B), opseq_event(OPSEQ_B, ops=gelu)])
    run(
        client,
        [*steps(range(28, 30), "shape-d", captured="opseq-d"), opseq_event("opseq-d", ops=gelu)],
    )
    run(client, steps(range(30, 31), "shape-e", captured="opseq-d"))  # the same op sequence
    run(client, steps(range(31, 32), "shape-c"))  # never captured
    incident = make_incident(
        session, job_of(session), "opseq_change", evidence={"to_shape_fp": SHAPE_B}
    )
    run_swap_loop(session=session, job_id=incident.job_id, settings=settings)
    run(client, steps(range(32, 35), SHAPE_B, policy=1, peak=220 * MIB))
    run_swap_loop(session=session, job_id=incident.job_id, settings=settings)
    session.commit()

    body = client.get(URL, headers=ADMIN).json()
    assert body["fingerprints"] == [
        {"shape_fp": SHAPE_A, "first_step": 0, "opseq": OPSEQ_A, "change": "first"},
        {"shape_fp": SHAPE_B, "first_step": 20, "opseq": OPSEQ_B, "change": "structure"},
        {"shape_fp": "shape-d", "first_step": 28, "opseq": "opseq-d", "change": "shapes"},
        {"shape_fp": "shape-e", "first_step": 30, "opseq": "opseq-d", "change": "same"},
        {"shape_fp": "shape-c", "first_step": 31, "opseq": None, "change": "unknown"},
    ]
    [policy] = body["policies"]
    created_at = policy.pop("created_at")
    assert created_at.endswith(("Z", "+00:00"))
    assert policy == {
        "version": 1,
        "opseq": OPSEQ_B,
        "state": "applied",
        "reason": "opseq_change",
        "budget_bytes": int(280 * MIB * 0.95),
        "predicted_peak_bytes": 210 * MIB,
        "measured_peak_bytes": 220 * MIB,
        "predicted_exposed_s": 0.0,
        "feasible": True,
        "applied_step": 32,
    }
    assert body["active"] == 1


def test_swap_of_a_job_without_any(client):
    start_job(client, opseq=None)
    body = client.get(URL, headers=ADMIN).json()
    assert body == {
        "fingerprints": [{"shape_fp": SHAPE_A, "first_step": 0, "opseq": None, "change": "first"}],
        "policies": [],
        "active": None,
    }


def test_swap_needs_a_read_token_and_a_known_job(client, session):
    start_job(client)
    _, reader = create_token(session=session, name="grafana", scopes=["read"])
    session.commit()
    assert client.get(URL).status_code == 401
    assert client.get(URL, headers=INGEST).status_code == 403
    assert client.get(URL, headers={"Authorization": f"Bearer {reader}"}).status_code == 200
    missing = client.get("/api/v1/jobs/nope/swap", headers=ADMIN)
    assert missing.status_code == 404 and "nope" in missing.json()["detail"]
