"""Swap service: make or reuse a policy for an op sequence; follow the steps' reports."""

from __future__ import annotations

from sqlalchemy import select

from backend.actions.models import Action
from backend.jobs.models import Rank
from backend.swap.models import SwapPolicy
from backend.swap.service import INITIAL_MARGIN, observe_steps, policy_for
from detectors.swap import generate
from tests.backend.swap.helpers import (
    MIB,
    OPSEQ_A,
    OPSEQ_B,
    SHAPE_A,
    SHAPE_B,
    heartbeat,
    ingest,
    job_of,
    opseq_event,
    profile,
    run,
    start_job,
    steps,
)


def make(session, opseq=OPSEQ_A, **kw):  # type: ignore[no-untyped-def]
    return policy_for(
        session=session, job_id=job_of(session).id, opseq=opseq, reason="opseq_change", **kw
    )


def test_policy_is_what_the_generator_makes_for_the_smallest_live_capacity(
    client, session, settings
):
    start_job(client)  # capacities 300 and 280 MiB
    out = make(session, settings=settings)
    assert out.created and out.policy is not None
    budget = int(280 * MIB * (1 - INITIAL_MARGIN))
    expected = generate(
        profile(OPSEQ_A),
        budget_bytes=budget,
        bandwidth_bytes_per_s=settings.swap_bandwidth_bytes_per_s,
        version=1,
    )
    row = out.policy
    assert row.policy == expected
    assert (row.version, row.state, row.budget_bytes, row.margin) == (1, "proposed", budget, 0.05)
    assert row.predicted_peak_bytes == expected["predicted_peak_bytes"] == 210 * MIB
    assert [o["storage"] for o in row.policy["offload"]] == [0] and row.feasible


def test_same_op_sequence_reuses_its_policy_one_per_bucket(client, session, settings):
    start_job(client)
    run(client, [opseq_event(OPSEQ_B, storages=4)])
    first = make(session, settings=settings).policy
    other = make(session, OPSEQ_B, settings=settings).policy
    again = make(session, settings=settings)
    assert first is not None and other is not None
    assert (first.version, other.version) == (1, 2)
    assert again.policy is first and not again.created  # A again: no new version
    assert session.scalar(select(SwapPolicy.version).order_by(SwapPolicy.version.desc())) == 2


def test_no_policy_until_a_swap_rank_its_capacity_and_the_profile_are_known(client, session):
    start_job(client, capacities=(None, None), swap=False)
    assert make(session).why == "no live rank runs the swap executor"
    ingest(client, [heartbeat(20, None)], rank=0)  # the swap flag, no capacity
    assert make(session).why == "no swap-capable rank reported its memory capacity"
    ingest(client, [heartbeat(21, 280 * MIB)], rank=0)
    missing = make(session, OPSEQ_B)
    assert (
        missing.policy is None and missing.why == f"op sequence {OPSEQ_B[:12]} has no profile yet"
    )
    assert make(session).policy is not None  # A was shipped with its profile


def test_exited_and_earlier_attempt_ranks_do_not_set_the_budget(client, session):
    start_job(client, capacities=(300 * MIB, 280 * MIB, 100 * MIB))
    rank2 = session.scalar(select(Rank).where(Rank.rank == 2))
    assert rank2 is not None and rank2.mem_capacity == 100 * MIB
    rank2.exited = True
    session.flush()
    assert make(session).policy.budget_bytes == int(280 * MIB * 0.95)  # type: ignore[union-attr]


def test_a_profile_that_fits_gets_an_empty_policy_with_a_version(client, session):
    start_job(client, capacities=(400 * MIB, 400 * MIB))
    row = make(session).policy
    assert row is not None and row.version == 1
    assert row.policy["offload"] == [] and row.feasible and row.predicted_peak_bytes == 310 * MIB


def test_an_unusable_profile_is_a_reason_not_an_error(client, session):
    start_job(client, opseq=None)
    bad = {**opseq_event(OPSEQ_B), "profile": {"ops": [], "saved": []}}
    run(client, [bad])
    out = make(session, OPSEQ_B)
    assert out.policy is None and "unusable: ops must be a non-empty list" in out.why


def test_steps_mark_applied_superseded_and_the_measured_peak(client, session):
    start_job(client)
    v1 = make(session).policy
    run(client, [opseq_event(OPSEQ_B, storages=4)])
    v2 = make(session, OPSEQ_B).policy
    assert v1 is not None and v2 is not None
    run(client, steps(range(20, 30), SHAPE_A, policy=1, peak=200 * MIB))
    run(client, steps(range(30, 32), SHAPE_A, policy=1, peak=215 * MIB))
    active = observe_steps(session=session, job_id=v1.job_id)
    assert active is v1 and v1.state == "applied" and v2.state == "proposed"
    assert (v1.applied_step, v1.measured_peak_bytes) == (20, 215 * MIB)
    run(client, steps(range(32, 40), SHAPE_B, policy=2, peak=250 * MIB))
    assert observe_steps(session=session, job_id=v1.job_id) is v2
    assert (v1.state, v2.state, v2.applied_step, v2.measured_peak_bytes) == (
        "superseded",
        "applied",
        32,
        250 * MIB,
    )
    assert v1.measured_peak_bytes == 215 * MIB  # kept from earlier runs
    run(client, steps(range(40, 45), SHAPE_A, policy=1, peak=205 * MIB))  # back to bucket A
    assert observe_steps(session=session, job_id=v1.job_id) is v1
    assert (v1.state, v2.state, v1.applied_step) == ("applied", "superseded", 20)


def test_a_policy_whose_action_failed_is_failed(client, session):
    start_job(client)
    row = make(session).policy
    assert row is not None
    action = Action(
        job_id=row.job_id,
        kind="apply_swap_policy",
        state="failed",
        idempotency_key="t-failed",
        requested_by="test",
        params={},
        deliveries={},
    )
    session.add(action)
    session.flush()
    row.action_id = action.id
    session.flush()
    observe_steps(session=session, job_id=row.job_id)
    assert row.state == "failed"
