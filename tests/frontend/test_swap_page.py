"""The job page's "Activation swapping" section: only for a job whose op sequence changed or
that has policies; op-sequence versions over steps, the active policy, predicted vs measured."""

from __future__ import annotations

from backend.swap.loop import run_swap_loop
from tests.backend.recovery.helpers import make_incident
from tests.backend.swap.helpers import (
    JOB,
    MIB,
    OPSEQ_B,
    SHAPE_A,
    SHAPE_B,
    job_of,
    opseq_event,
    run,
    start_job,
    steps,
)

PAGE = f"/jobs/{JOB}"


def test_no_section_for_a_job_that_never_changed_or_swapped(client):
    start_job(client)
    html = client.get(PAGE).text
    assert 'id="swap"' not in html and "Activation swapping" not in html


def test_section_shows_versions_the_active_policy_and_predicted_vs_measured(
    client, session, settings
):
    start_job(client)
    run(client, [*steps(range(20, 28), SHAPE_B, captured=OPSEQ_B), opseq_event(OPSEQ_B)])
    incident = make_incident(
        session, job_of(session), "opseq_change", evidence={"to_shape_fp": SHAPE_B}
    )
    run_swap_loop(session=session, job_id=incident.job_id, settings=settings)
    session.commit()
    proposed = client.get(PAGE).text
    assert 'id="swap"' in proposed and "No policy applied yet." in proposed
    assert 'data-version="1" data-state="proposed"' in proposed

    run(client, steps(range(28, 31), SHAPE_B, policy=1, peak=300 * MIB))  # over its budget
    run_swap_loop(session=session, job_id=incident.job_id, settings=settings)
    session.commit()
    html = client.get(PAGE).text
    assert "Activation swapping" in html
    assert f'<code title="{SHAPE_A}">{SHAPE_A[:12]}</code>' in html  # versions over steps
    assert 'data-step="20"' in html
    assert "Active policy: <strong>v1</strong>" in html and "since step 28" in html
    assert "predicted peak 210.0 MiB, measured 300.0 MiB, budget 266.0 MiB" in html
    assert 'data-version="1" data-state="applied" class="over-budget"' in html
    assert 'data-version="2" data-state="proposed"' in html  # made again with more margin
    assert "over_budget" in html


def test_section_lists_the_latest_twenty_shapes(client):
    start_job(client, numbers=range(1))
    run(client, [e for n in range(1, 22) for e in steps(range(n, n + 1), f"shape-{n:02d}")])
    html = client.get(PAGE).text
    assert "(the latest 20 of 22)" in html
    assert 'data-step="2"' in html and 'data-step="1"' not in html
