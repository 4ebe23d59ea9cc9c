"""The loop end to end through the real detection run (``run_detection``, what the embedded
ticker and the Celery ``detect_job`` task both call): ingest → opseq_change → policy →
action in a rank's ingest reply → steps report it → applied."""

from __future__ import annotations

from sqlalchemy import select

from backend.celery_app import Runtime
from backend.detection.tasks import run_detection
from backend.incidents.models import Incident
from backend.swap.models import SwapPolicy
from tests.backend.swap.helpers import (
    MIB,
    OPSEQ_B,
    SHAPE_B,
    ingest,
    job_of,
    opseq_event,
    run,
    start_job,
    steps,
)


def test_a_detected_drift_becomes_a_policy_the_job_reports_applied(
    client, session, session_factory, settings
):
    rt = Runtime(settings=settings, factory=session_factory)
    start_job(client, numbers=range(40))
    run(client, [*steps(range(40, 60), SHAPE_B, captured=OPSEQ_B), opseq_event(OPSEQ_B)])
    job_id = job_of(session).id
    run_detection(rt, job_id)

    [incident] = session.scalars(select(Incident).where(Incident.kind == "opseq_change"))
    [row] = session.scalars(select(SwapPolicy))
    assert (row.version, row.opseq, row.state, row.incident_id) == (
        1,
        OPSEQ_B,
        "proposed",
        incident.id,
    )
    reply = ingest(client, steps(range(60, 61), SHAPE_B), rank=0)
    [sent] = reply["actions"]
    assert sent["kind"] == "apply_swap_policy"
    assert sent["params"] == {"policy": row.policy, "shape_fp": SHAPE_B}

    run(client, steps(range(61, 70), SHAPE_B, policy=1, peak=row.predicted_peak_bytes))
    run_detection(rt, job_id)
    session.expire_all()
    row = session.scalars(select(SwapPolicy)).one()
    assert (row.state, row.applied_step, row.measured_peak_bytes) == (
        "applied",
        61,
        row.predicted_peak_bytes,
    )
    assert row.measured_peak_bytes <= row.budget_bytes == int(280 * MIB * 0.95)


def test_a_failing_swap_loop_keeps_the_detection_runs_incidents(
    client, session, session_factory, settings, caplog
):
    rt = Runtime(settings=settings, factory=session_factory)
    start_job(client, numbers=range(40))
    run(client, [*steps(range(40, 60), SHAPE_B, captured=OPSEQ_B), opseq_event(OPSEQ_B)])
    job_id = job_of(session).id
    broken = SwapPolicy(
        job_id=job_id,
        version=1,
        opseq=OPSEQ_B,
        budget_bytes=1,
        bandwidth_bytes_per_s=1.0,
        reason="opseq_change",
        state="bogus",  # not a state: moving it to applied raises inside the loop
        policy={},
        predicted_peak_bytes=1,
    )
    session.add(broken)
    session.commit()
    run(client, steps(range(60, 62), SHAPE_B, policy=1, peak=5))
    run_detection(rt, job_id)
    session.expire_all()
    assert session.scalars(select(Incident.kind)).all() == ["opseq_change"]
    row = session.scalars(select(SwapPolicy)).one()
    assert (row.state, row.applied_step) == ("bogus", None)  # its writes undone, not half-kept
    assert "swap loop failed for job" in caplog.text
