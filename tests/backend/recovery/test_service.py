"""Recovery service: policy → cost model → guards → actions, and the audit of each step."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import select

from backend.actions.service import create_action, dispatch_for_rank, record_report
from backend.audit.models import AuditEntry
from backend.audit.service import list_audit
from backend.db import utcnow
from backend.recovery import service
from backend.recovery.facts import job_timing
from backend.recovery.policies import PolicyError, effective_policy, put_policy
from backend.telemetry.models import JobEvent
from tests.backend.recovery.helpers import make_incident, make_job


def events(session, job):  # type: ignore[no-untyped-def]
    return [(e.actor, e.event) for e in reversed(list_audit(session=session, job_id=job.id))]


def policy(session, job, kind="*", mode="auto", **params):  # type: ignore[no-untyped-def]
    put_policy(session=session, job=job, kind=kind, mode=mode, actor="test", params=params)


def test_policy_resolution_most_specific_wins(session):
    job = "llama"
    assert effective_policy(session=session, job=job, kind="hang").mode == "approve"  # built-in
    assert effective_policy(session=session, job=job, kind="hang").source == "built-in"
    policy(session, "*", "*", "off")
    assert effective_policy(session=session, job=job, kind="hang").source == "*/*"
    policy(session, "*", "hang", "auto")
    assert effective_policy(session=session, job=job, kind="hang").source == "*/hang"
    policy(session, job, "*", "off")
    assert effective_policy(session=session, job=job, kind="hang").source == "llama/*"
    policy(session, job, "hang", "approve", horizon_s=60)
    hang = effective_policy(session=session, job=job, kind="hang")
    assert (hang.source, hang.mode, hang.params) == ("llama/hang", "approve", {"horizon_s": 60})
    assert effective_policy(session=session, job=job, kind="nan").mode == "off"  # llama/*
    assert effective_policy(session=session, job="other", kind="hang").mode == "auto"
    assert effective_policy(session=session, job="other", kind="nan").mode == "off"


def test_put_policy_upserts_and_is_audited(session):
    job = make_job(session)
    row, created = put_policy(session=session, job=job.name, kind="hang", mode="auto", actor="a")
    again, created2 = put_policy(
        session=session, job=job.name, kind="hang", mode="off", actor="b", actions=["dump_stacks"]
    )
    assert (created, created2, again.id, again.mode) == (True, False, row.id, "off")
    assert again.actions == ["dump_stacks"] and again.updated_by == "b"
    [latest, first] = list_audit(session=session, job_id=job.id)
    assert (latest.event, latest.actor, first.actor) == ("policy_set", "b", "a")
    assert latest.detail["previous"]["mode"] == "auto"


@pytest.mark.parametrize(
    ("field", "kwargs"),
    [
        ("kind", {"kind": "meltdown"}),
        ("mode", {"mode": "sometimes"}),
        ("actions", {"actions": ["reboot_cluster"]}),
        ("params.horizon_s", {"params": {"horizon_s": -1}}),
        ("params.colour", {"params": {"colour": "red"}}),
    ],
)
def test_put_policy_names_the_bad_field(session, field, kwargs):
    args = {"job": "llama", "kind": "hang", "mode": "auto", "actor": "t", **kwargs}
    with pytest.raises(PolicyError, match=f"^{field}"):
        put_policy(session=session, **args)


def test_auto_creates_a_pending_action_with_reasoning(session, settings):
    job = make_job(session)
    policy(session, job.name, "hang")
    incident = make_incident(session, job, "hang", ranks=(3,))
    [action] = service.respond(session=session, incidents=[incident], settings=settings)
    assert (action.kind, action.state, action.requested_by) == ("restart", "pending", "policy")
    assert action.incident_id == incident.id
    assert action.idempotency_key == f"incident:{incident.id}:restart"
    assert action.reason.startswith("restart (est.")
    reasoning = action.reasoning
    assert reasoning["chosen"] == "restart"
    costs = {c["action"]: c["cost_s"] for c in reasoning["candidates"]}
    assert costs["restart"] == pytest.approx(120 + 9)  # 9 steps of 1 s since the checkpoint
    assert costs[None] > costs["restart"]
    assert {g["guard"] for g in reasoning["guards"]} == {"cooldown", "hourly_cap"}
    assert reasoning["facts"]["since_checkpoint_s"] == 9
    assert reasoning["work_at_risk"] == "9 steps since the checkpoint at step 90"
    assert [a["id"] for a in dispatch_for_rank(session=session, job_id=job.id, rank=0)] == [
        action.id
    ]
    assert ("policy", "created") in events(session, job)


def test_approve_mode_proposes_and_ranks_wait_for_approval(session, settings):
    job = make_job(session)
    incident = make_incident(session, job, "hang")  # no policy row: built-in "approve"
    [action] = service.respond(session=session, incidents=[incident], settings=settings)
    assert action.state == "proposed"
    assert dispatch_for_rank(session=session, job_id=job.id, rank=0) == []
    service.approve(session=session, action_id=action.id, actor="api:oncall", settings=settings)
    assert (action.state, action.approved_by) == ("pending", "api:oncall")
    assert action.reasoning["approval"]["by"] == "api:oncall"
    assert [a["id"] for a in dispatch_for_rank(session=session, job_id=job.id, rank=0)] == [
        action.id
    ]
    assert events(session, job) == [("policy", "proposed"), ("api:oncall", "approved")]


def test_approve_and_cancel_check_state_and_job(session, settings):
    job = make_job(session)
    [action] = service.respond(
        session=session, incidents=[make_incident(session, job)], settings=settings
    )
    with pytest.raises(service.NotFound):
        service.approve(session=session, action_id=99999, actor="x")
    with pytest.raises(service.NotFound):
        service.approve(session=session, action_id=action.id, actor="x", job_id=job.id + 1)
    service.cancel(session=session, action_id=action.id, actor="api:oncall", note="false alarm")
    assert action.state == "cancelled"
    with pytest.raises(service.Conflict, match="only a proposed action"):
        service.approve(session=session, action_id=action.id, actor="x")
    with pytest.raises(service.Conflict, match="cannot be cancelled"):
        service.cancel(session=session, action_id=action.id, actor="x")
    assert events(session, job)[-1] == ("api:oncall", "cancelled")


def test_cancel_stops_delivery_of_a_pending_action(session, settings):
    job = make_job(session)
    policy(session, job.name)
    [action] = service.respond(
        session=session, incidents=[make_incident(session, job)], settings=settings
    )
    dispatch_for_rank(session=session, job_id=job.id, rank=0)
    assert action.state == "dispatched"
    service.cancel(session=session, action_id=action.id, actor="api:oncall")
    assert dispatch_for_rank(session=session, job_id=job.id, rank=1) == []


def test_respond_twice_makes_one_action(session, settings):
    job = make_job(session)
    policy(session, job.name)
    incident = make_incident(session, job)
    assert len(service.respond(session=session, incidents=[incident], settings=settings)) == 1
    assert service.respond(session=session, incidents=[incident], settings=settings) == []
    assert events(session, job)[-1] == ("policy", "skipped")


def test_off_does_nothing_but_audit(session, settings):
    job = make_job(session)
    policy(session, job.name, "hang", "off")
    incident = make_incident(session, job)
    assert service.respond(session=session, incidents=[incident], settings=settings) == []
    [entry] = list_audit(session=session, job_id=job.id, incident_id=incident.id)
    assert entry.event == "skipped" and "off" in entry.detail["reason"]


def test_transient_straggler_gets_no_action(session, settings):
    job = make_job(session, world_size=512)
    policy(session, job.name, allow_evict=True, horizon_s=36_000)
    incident = make_incident(
        session, job, "straggler", ranks=(6,), status="resolved", evidence={"ratio": 1.5}
    )
    assert service.respond(session=session, incidents=[incident], settings=settings) == []
    [entry] = list_audit(session=session, job_id=job.id, incident_id=incident.id)
    assert entry.event == "no_action"
    assert entry.detail["reasoning"]["chosen"] is None


def test_persistent_straggler_is_evicted_when_allowed(session, settings):
    job = make_job(session, world_size=512)
    policy(session, job.name, "straggler", allow_evict=True, horizon_s=36_000)
    evidence = {"rank_compute_s": 1.03, "median_compute_s": 1.0, "ratio": 1.03}
    incident = make_incident(session, job, "straggler", ranks=(6,), evidence=evidence)
    [action] = service.respond(session=session, incidents=[incident], settings=settings)
    assert (action.kind, action.params, action.target_ranks) == ("evict_rank", {"ranks": [6]}, None)


def test_nan_rolls_back_past_the_first_bad_step(session, settings):
    job = make_job(session, checkpoint_at=None)
    session.add_all([_ckpt(job, 40), _ckpt(job, 80)])
    policy(session, job.name)
    incident = make_incident(session, job, "nan", ranks=(), first_step=60)
    [action] = service.respond(session=session, incidents=[incident], settings=settings)
    assert (action.kind, action.params) == ("rollback", {"before_step": 59})
    assert action.reasoning["work_at_risk"] == "59 steps since the checkpoint at step 40"


def _ckpt(job, step):  # type: ignore[no-untyped-def]
    return JobEvent(job_id=job.id, rank=0, name="checkpoint_saved", step=step, attrs={})


def test_job_timing_without_checkpoints_puts_everything_at_risk(session):
    job = make_job(session, checkpoint_at=None, step_s=2.0)
    timing = job_timing(session=session, job_id=job.id, attempt=0)
    assert (timing.step_s, timing.since_checkpoint_s, timing.last_step) == (2.0, 198.0, 99)
    assert "no checkpoint_saved event" in timing.note
    empty = make_job(session, "empty", steps=0)
    assert job_timing(session=session, job_id=empty.id, attempt=0).since_checkpoint_s == 0


def test_cooldown_blocks_a_second_automatic_restart(session, settings):
    job = make_job(session)
    policy(session, job.name)
    first, second = make_incident(session, job), make_incident(session, job, "crash")
    made = service.respond(session=session, incidents=[first, second], settings=settings)
    assert [a.incident_id for a in made] == [first.id]
    [blocked] = list_audit(session=session, job_id=job.id, incident_id=second.id)
    assert (blocked.event, blocked.detail["guard"]) == ("blocked", "cooldown")
    assert blocked.detail["action"] == "restart"
    assert "cooldown is 5 min" in blocked.detail["message"]
    # Past the cooldown the next one goes through.
    later = utcnow() + timedelta(seconds=settings.restart_cooldown_s + 1)
    third = make_incident(session, job, "crash")
    assert len(service.respond(session=session, incidents=[third], settings=settings, now=later))


def test_hourly_cap_counts_every_restart_and_blocks(session, settings):
    job = make_job(session)
    policy(session, job.name, cooldown_s=0, max_restarts_per_hour=2)
    # A person's restart counts toward the cap (not toward the policy's cooldown).
    create_action(session=session, job_id=job.id, kind="restart", requested_by="api:oncall")
    incidents = [make_incident(session, job) for _ in range(2)]
    made = service.respond(session=session, incidents=incidents, settings=settings)
    assert len(made) == 1
    [blocked] = list_audit(session=session, job_id=job.id, incident_id=incidents[1].id)
    assert (blocked.event, blocked.detail["guard"]) == ("blocked", "hourly_cap")
    assert "2 restart/evict/rollback action(s) in the last hour" in blocked.detail["message"]


def test_non_disruptive_actions_skip_the_guards(session, settings):
    job = make_job(session)
    policy(session, job.name, max_restarts_per_hour=0)
    slow = make_incident(session, job, "slowdown", ranks=(), evidence={"rise_pct": 30})
    [action] = service.respond(session=session, incidents=[slow], settings=settings)
    assert action.kind == "dump_stacks"
    hang = make_incident(session, job)
    assert service.respond(session=session, incidents=[hang], settings=settings) == []


def test_approval_rechecks_the_guards_unless_forced(session, settings):
    job = make_job(session)
    incidents = [make_incident(session, job), make_incident(session, job, "crash")]
    first, second = service.respond(session=session, incidents=incidents, settings=settings)
    assert (first.state, second.state) == ("proposed", "proposed")  # proposals don't count
    service.approve(session=session, action_id=first.id, actor="api:a", settings=settings)
    with pytest.raises(service.GuardBlocked, match="cooldown") as err:
        service.approve(session=session, action_id=second.id, actor="api:a", settings=settings)
    assert [g.guard for g in err.value.guards if not g.ok] == ["cooldown"]
    assert second.state == "proposed"
    assert events(session, job)[-1] == ("api:a", "blocked")
    service.approve(
        session=session, action_id=second.id, actor="api:a", settings=settings, force=True
    )
    assert second.state == "pending" and second.reasoning["approval"]["forced"] is True


def test_expire_actions_marks_stale_proposals(session, settings):
    job = make_job(session)
    [action] = service.respond(
        session=session, incidents=[make_incident(session, job)], settings=settings
    )
    assert service.expire_actions(session=session) == []
    later = action.expires_at + timedelta(seconds=1)
    with pytest.raises(service.Conflict, match="expired"):
        service.approve(session=session, action_id=action.id, actor="x", now=later)
    assert service.expire_actions(session=session, now=later) == [action]
    assert action.state == "expired"
    assert events(session, job)[-1] == ("system", "expired")


def test_rank_reports_are_audited_once_per_state_change(session, settings):
    job = make_job(session, world_size=2)
    action, _ = create_action(session=session, job_id=job.id, kind="dump_stacks", requested_by="t")
    for rank, state in [(0, "acked"), (1, "acked"), (0, "succeeded"), (1, "succeeded")]:
        record_report(
            session=session, job_id=job.id, rank=rank, world_size=2, action_id=action.id,
            state=state, result=None,
        )  # fmt: skip
    assert events(session, job) == [("t", "created"), ("rank:0", "acked"), ("rank:1", "succeeded")]


def test_audit_rows_are_stored(session, settings):
    job = make_job(session)
    service.respond(session=session, incidents=[make_incident(session, job)], settings=settings)
    session.commit()
    stored = session.scalars(select(AuditEntry).where(AuditEntry.job_id == job.id)).all()
    assert [e.event for e in stored] == ["proposed"]
