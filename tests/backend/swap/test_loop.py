"""The swap loop: drift and memory pressure become an ``apply_swap_policy`` action through
the recovery policy; steps that run a policy over its budget get one with more margin."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from backend.actions.models import Action
from backend.audit.service import list_audit
from backend.recovery import service as recovery
from backend.recovery.policies import put_policy
from backend.swap.loop import run_swap_loop
from backend.swap.models import SwapPolicy
from detectors.policy import SWAP_LOOP_NOTE
from detectors.swap import generate
from tests.backend.recovery.helpers import make_incident
from tests.backend.swap.helpers import (
    JOB,
    MIB,
    OPSEQ_A,
    OPSEQ_B,
    SHAPE_A,
    SHAPE_B,
    ingest,
    job_of,
    opseq_event,
    profile,
    run,
    start_job,
    steps,
)


def drift(session, *, to_opseq=OPSEQ_B):  # type: ignore[no-untyped-def]
    """The opseq_change incident the detector opens for A → B (``detectors.opseq``)."""
    evidence = {
        "from_shape_fp": SHAPE_A,
        "to_shape_fp": SHAPE_B,
        "from_opseq": OPSEQ_A,
        "to_opseq": to_opseq,
        "change": "structure" if to_opseq else "unknown",
    }
    return make_incident(
        session, job_of(session), "opseq_change", ranks=(), evidence=evidence, first_step=20
    )


def loop(session, settings):  # type: ignore[no-untyped-def]
    return run_swap_loop(session=session, job_id=job_of(session).id, settings=settings)


def swap_actions(session):  # type: ignore[no-untyped-def]
    query = select(Action).where(Action.kind == "apply_swap_policy").order_by(Action.id)
    return list(session.scalars(query))


def test_opseq_change_sends_the_generated_policy_to_every_live_swap_rank(client, session, settings):
    start_job(client)
    run(client, [*steps(range(20, 30), SHAPE_B, captured=OPSEQ_B), opseq_event(OPSEQ_B)])
    incident = drift(session)
    [action] = loop(session, settings)
    expected = generate(
        profile(OPSEQ_B),
        budget_bytes=int(280 * MIB * 0.95),
        bandwidth_bytes_per_s=settings.swap_bandwidth_bytes_per_s,
        version=1,
    )
    assert action.params == {"policy": expected, "shape_fp": SHAPE_B}
    assert (action.state, action.target_ranks, action.incident_id) == (
        "pending",
        [0, 1],
        incident.id,
    )
    assert action.requested_by == "policy" and action.reasoning["policy"]["mode"] == "auto"
    assert action.reasoning["policy"]["source"] == "built-in"
    assert "swap policy v1" in action.reason and "offload 1 saved storage" in action.reason
    row = session.scalar(select(SwapPolicy))
    assert (row.version, row.reason, row.incident_id, row.action_id) == (
        1,
        "opseq_change",
        incident.id,
        action.id,
    )
    assert loop(session, settings) == []  # one action per incident and version
    reply = ingest(client, steps(range(30, 31), SHAPE_B), rank=1)
    assert [(a["kind"], a["params"]["policy"]["version"]) for a in reply["actions"]] == [
        ("apply_swap_policy", 1)
    ]


def test_no_action_until_the_new_sequence_and_its_profile_arrive(client, session, settings):
    start_job(client)
    run(client, steps(range(20, 30), SHAPE_B))  # not captured yet: the sequence is unknown
    drift(session, to_opseq=None)
    assert loop(session, settings) == [] and session.scalar(select(SwapPolicy)) is None
    run(client, steps(range(30, 32), SHAPE_B, captured=OPSEQ_B))  # captured, no profile yet
    assert loop(session, settings) == [] and session.scalar(select(SwapPolicy)) is None
    run(client, [opseq_event(OPSEQ_B)])
    [action] = loop(session, settings)
    assert action.params["shape_fp"] == SHAPE_B
    assert action.params["policy"]["fingerprint"] == OPSEQ_B


def test_memory_pressure_gets_the_policy_for_the_shape_the_job_runs(client, session, settings):
    start_job(client)
    incident = make_incident(session, job_of(session), "memory_pressure", ranks=(0, 1))
    recovery.respond(session=session, incidents=[incident], settings=settings)
    [decided] = list_audit(session=session, job_id=incident.job_id, incident_id=incident.id)
    skipped = decided.detail["reasoning"]["skipped"]  # the cost model leaves it to the loop
    assert {"action": "apply_swap_policy", "why": SWAP_LOOP_NOTE} in skipped
    [action] = loop(session, settings)
    assert action.params["shape_fp"] == SHAPE_A
    assert action.params["policy"]["fingerprint"] == OPSEQ_A
    assert session.scalar(select(SwapPolicy.reason)) == "memory_pressure"


@pytest.mark.parametrize(
    ("rows", "state"),
    [
        ([], "pending"),  # the built-in default for apply_swap_policy is auto
        ([("*", "*", "approve", None)], "proposed"),  # a user's policy says otherwise
        ([(JOB, "opseq_change", "auto", ["apply_swap_policy"])], "pending"),
        ([(JOB, "opseq_change", "approve", None)], "proposed"),
        ([("*", "opseq_change", "off", None)], None),
        ([(JOB, "*", "auto", ["dump_stacks"])], None),  # not among the allowed actions
    ],
)
def test_the_recovery_policy_decides_whether_and_how(client, session, settings, rows, state):
    for job, kind, mode, actions in rows:
        put_policy(session=session, job=job, kind=kind, mode=mode, actor="t", actions=actions)
    start_job(client)
    run(client, [*steps(range(20, 30), SHAPE_B, captured=OPSEQ_B), opseq_event(OPSEQ_B)])
    drift(session)
    created = loop(session, settings)
    assert [a.state for a in created] == ([state] if state else [])


def test_a_job_without_swap_ranks_is_left_alone(client, session, settings):
    start_job(client, swap=False)
    run(client, [*steps(range(20, 30), SHAPE_B, captured=OPSEQ_B), opseq_event(OPSEQ_B)])
    drift(session)
    assert loop(session, settings) == [] and session.scalar(select(SwapPolicy)) is None


def test_a_policy_the_job_runs_or_has_received_is_not_sent_again(client, session, settings):
    start_job(client)
    job = job_of(session)
    first = make_incident(session, job, "memory_pressure", ranks=(0,))
    [action] = loop(session, settings)
    second = make_incident(session, job, "memory_pressure", ranks=(1,))  # v1 on its way
    assert loop(session, settings) == []
    run(client, steps(range(20, 25), SHAPE_A, policy=1, peak=200 * MIB))
    assert loop(session, settings) == []  # the job runs v1
    assert [a.incident_id for a in swap_actions(session)] == [first.id]
    assert second.id != first.id and action.params["policy"]["version"] == 1


def test_over_budget_makes_it_again_with_more_margin_up_to_the_cap(client, session, settings):
    start_job(client)  # the smallest capacity: 280 MiB
    make_incident(session, job_of(session), "memory_pressure", ranks=(0, 1))
    loop(session, settings)
    step = 20
    for version in (1, 2, 3):
        budget = session.scalar(
            select(SwapPolicy.budget_bytes).where(SwapPolicy.version == version)
        )
        run(client, steps(range(step, step + 5), SHAPE_A, policy=version, peak=budget + MIB))
        step += 5
        [action] = loop(session, settings)
        assert action.params["policy"]["version"] == version + 1
        assert action.params["shape_fp"] == SHAPE_A
        assert loop(session, settings) == []  # not again while it is on its way
    rows = list(session.scalars(select(SwapPolicy).order_by(SwapPolicy.version)))
    assert [(r.margin, r.reason) for r in rows] == [
        (0.05, "memory_pressure"),
        (0.15, "over_budget"),
        (0.25, "over_budget"),
        (0.35, "over_budget"),
    ]
    assert [r.budget_bytes for r in rows] == [int(280 * MIB * (1 - r.margin)) for r in rows]
    assert [r.state for r in rows] == ["superseded", "superseded", "applied", "proposed"]
    run(client, steps(range(step, step + 5), SHAPE_A, policy=4, peak=rows[3].budget_bytes + 1))
    assert loop(session, settings) == []  # at the cap: no fifth version
    assert rows[3].state == "applied" and len(swap_actions(session)) == 4
