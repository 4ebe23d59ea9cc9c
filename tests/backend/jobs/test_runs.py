"""Jobs have a life cycle (issue 17): each launch of a job name is a run, kept apart, with a
state (running, finished, failed, lost) from goodbyes, exit codes and silences; when a run
ends its open incidents resolve and its open actions expire, with the reason; nobody can
act on a run with no live rank (409).

Seen before: running the same job twice merged both runs' steps 0-199 into one job, both
attempt 0; after ``vigil demo --replay`` ended a critical crash naming all 10 ranks was
raised and a restart proposed; an approved restart for a crash whose launcher was gone
stayed ``pending`` forever; a proposed restart for a resolved straggler kept its Approve.
"""

from __future__ import annotations

import time
from datetime import timedelta

from sqlalchemy import func, select, update

from backend.actions.models import Action
from backend.actions.service import create_action
from backend.db import utcnow
from backend.demo.replay import DEMO_JOB, pai_batches
from backend.detection.runner import active_jobs, detect_job, sweep_job
from backend.detection.window import load_steps
from backend.incidents.follow_up import follow_up
from backend.incidents.models import Incident
from backend.incidents.service import apply_findings
from backend.jobs.launches import RELAUNCH_QUIET_S
from backend.jobs.models import Job, Rank
from backend.telemetry.models import StepRecord
from detectors.finding import Finding
from tests.conftest import ADMIN, INGEST
from tests.factories import batch, step

JOB = "llama-8b-pretrain"


def send(client, events, **fields):  # type: ignore[no-untyped-def]
    reply = client.post("/api/v1/ingest", json=batch(events, **fields), headers=INGEST)
    assert reply.status_code == 200, reply.text
    return reply.json()


def beat(ts: float | None = None, **fields):  # type: ignore[no-untyped-def]
    return {"type": "heartbeat", "ts": time.time() if ts is None else ts, **fields}


def job_id(session, name: str = JOB) -> int:  # type: ignore[no-untyped-def]
    session.expire_all()
    return session.scalars(select(Job.id).where(Job.name == name)).one()


def age_the_ranks(session, seconds: float) -> None:  # type: ignore[no-untyped-def]
    """Time passes without a batch: the ranks were last seen ``seconds`` ago."""
    session.execute(update(Rank).values(last_seen_at=utcnow() - timedelta(seconds=seconds)))
    session.commit()


def sweep(session, settings, name: str = JOB, *, later_s: float = 0.0):  # type: ignore[no-untyped-def]
    """One pass of the periodic sweep for the job, as the ticker runs it (``later_s`` from
    now), committed."""
    now = time.time() + later_s
    changes = sweep_job(session=session, job_id=job_id(session, name), now=now)
    follow_up(session=session, changes=changes, settings=settings)
    session.commit()
    return changes


def runs(client, name: str = JOB) -> list[dict]:  # type: ignore[no-untyped-def]
    reply = client.get(f"/api/v1/jobs/{name}/runs", headers=ADMIN)
    assert reply.status_code == 200, reply.text
    return reply.json()


def launch(client, key: str, *, steps: int = 200, ranks: int = 2, goodbye: bool = True) -> None:  # type: ignore[no-untyped-def]
    """One launch of the job: ``steps`` steps on each rank, then (``goodbye``) a clean exit."""
    now = time.time()
    for rank in range(ranks):
        events = [step(n, ts=now - steps + n) for n in range(steps)]
        send(client, [*events, beat(now, step=steps)], rank=rank, world_size=ranks, run=key)
    if goodbye:
        for rank in range(ranks):
            send(
                client,
                [beat(now + 1, exiting=True, exit_code=0)],
                rank=rank,
                world_size=ranks,
                run=key,
            )


def propose_restart(session, job: int, incident_id: int | None = None) -> Action:  # type: ignore[no-untyped-def]
    """A restart proposed as the policy does (mode ``approve``), committed."""
    action, _ = create_action(
        session=session,
        job_id=job,
        kind="restart",
        requested_by="policy",
        incident_id=incident_id,
        state="proposed",
    )
    session.commit()
    return action


def slow_rank_1() -> Finding:
    """What the straggler detector reports for rank 1, slow from step 5."""
    return Finding(
        kind="straggler",
        severity="warning",
        ranks=(1,),
        first_step=5,
        score=2.0,
        summary="rank 1 is slow",
        key="straggler:1",
    )


# -- runs are kept apart ------------------------------------------------------------------


def test_launching_the_same_job_twice_gives_two_runs_kept_apart(client, session):
    launch(client, "launch-a")
    launch(client, "launch-b", goodbye=False)
    for number in (1, 2):
        page = client.get(
            f"/api/v1/jobs/{JOB}/steps", params={"run": number, "limit": 10_000}, headers=ADMIN
        ).json()["items"]
        assert sorted((s["step"], s["rank"]) for s in page) == [
            (n, r) for n in range(200) for r in (0, 1)
        ]
        assert {(s["run"], s["attempt"]) for s in page} == {(number, 0)}
    # Detection judges the current run only: each (rank, step) once, not twice.
    jid = job_id(session)
    current = session.scalar(select(Job.attempt).where(Job.id == jid))
    judged = select(func.count()).where(StepRecord.job_id == jid, StepRecord.attempt == current)
    assert session.scalar(judged) == 400
    listed = runs(client)
    assert [(r["number"], r["key"], r["state"]) for r in listed] == [
        (2, "launch-b", "running"),
        (1, "launch-a", "finished"),
    ]
    assert "every rank (2) exited cleanly" in listed[1]["reason"]
    job = client.get(f"/api/v1/jobs/{JOB}", headers=ADMIN).json()
    assert (job["run"]["number"], job["attempt"], job["state"]) == (2, 0, "running")
    assert [r["number"] for r in job["runs"]] == [2, 1]
    window = load_steps(session=session, job_id=jid, width=1000)
    assert window is not None and window.steps.tolist() == list(range(200))


def test_a_new_launch_while_the_current_run_reports_waits_apart_then_takes_over(client, session):
    launch(client, "launch-a", goodbye=False)
    send(client, [step(0), step(1)], rank=0, world_size=2, run="launch-b")  # a's ranks report
    assert [(r["number"], r["state"]) for r in runs(client)] == [(2, "running"), (1, "running")]
    job = client.get(f"/api/v1/jobs/{JOB}", headers=ADMIN).json()
    assert job["run"]["key"] == "launch-a"  # one stray payload does not blind detection of a
    b = client.get(f"/api/v1/jobs/{JOB}/steps", params={"run": 2}, headers=ADMIN).json()
    assert [s["step"] for s in b["items"]] == [0, 1]
    for rank in (0, 1):  # a ends: b's next batch takes over
        send(client, [beat(exiting=True)], rank=rank, world_size=2, run="launch-a")
    send(client, [step(2)], rank=0, world_size=2, run="launch-b")
    job = client.get(f"/api/v1/jobs/{JOB}", headers=ADMIN).json()
    assert (job["run"]["key"], job["run"]["number"]) == ("launch-b", 2)
    assert runs(client)[1]["state"] == "finished"


def test_a_restart_stays_in_its_run(client, session, settings):
    launch(client, "launch-a", steps=20, goodbye=False)
    for rank in (0, 1):  # an exit for restart: a failing code, then torchrun's next attempt
        send(client, [beat(exiting=True, exit_code=3)], rank=rank, world_size=2, run="launch-a")
    sweep(session, settings)
    assert runs(client)[0]["state"] == "running"  # a restart may follow: not over yet
    send(client, [step(20), beat()], rank=0, world_size=2, attempt=1, run="launch-a")
    job = client.get(f"/api/v1/jobs/{JOB}", headers=ADMIN).json()
    assert (job["run"]["number"], job["attempt"], job["state"]) == (1, 1, "running")
    ranks = client.get(f"/api/v1/jobs/{JOB}/ranks", headers=ADMIN).json()
    assert [(r["rank"], r["run"], r["attempt"]) for r in ranks] == [(0, 1, 1), (1, 1, 0)]


# -- run state ------------------------------------------------------------------------------


def test_a_run_finishes_when_every_rank_says_goodbye(client, session, settings):
    launch(client, "launch-a", steps=20)
    sweep(session, settings)
    [listed] = client.get("/api/v1/jobs", headers=ADMIN).json()
    assert (listed["state"], listed["run"]["state"], listed["ranks_reporting"]) == (
        "finished",
        "finished",
        0,
    )
    assert listed["run"]["ended_at"] is not None


def test_a_failing_exit_code_fails_the_run_once_no_restart_followed(client, session, settings):
    launch(client, "launch-a", steps=20, goodbye=False)
    send(client, [beat(exiting=True, exit_code=0)], rank=0, world_size=2, run="launch-a")
    send(client, [beat(exiting=True, exit_code=1)], rank=1, world_size=2, run="launch-a")
    sweep(session, settings)
    assert runs(client)[0]["state"] == "running"
    age_the_ranks(session, RELAUNCH_QUIET_S + 1)
    sweep(session, settings)
    [run] = runs(client)
    assert run["state"] == "failed"
    assert "rank 1: 1" in run["reason"]
    ranks = client.get(f"/api/v1/jobs/{JOB}/ranks", headers=ADMIN).json()
    assert [(r["exited"], r["exit_code"]) for r in ranks] == [(True, 0), (True, 1)]


def test_ranks_that_stop_without_a_goodbye_lose_the_run(client, session, settings):
    launch(client, "launch-a", steps=20, goodbye=False)
    age_the_ranks(session, RELAUNCH_QUIET_S + 1)
    sweep(session, settings)
    [run] = runs(client)
    assert run["state"] == "lost"
    assert "ranks 0, 1 stopped reporting without saying goodbye" in run["reason"]


# -- the end of a run: incidents and actions -------------------------------------------------


def test_a_replay_that_ended_raises_no_crash_and_finishes(client, session, settings):
    for body in pai_batches():
        assert client.post("/api/v1/ingest", json=body, headers=INGEST).status_code == 200
    changes = sweep(session, settings, DEMO_JOB, later_s=30)  # every rank long silent
    assert not [i.kind for i in changes.opened]
    kinds = session.scalars(
        select(Incident.kind).where(Incident.job_id == job_id(session, DEMO_JOB))
    )
    assert not set(kinds) & {"crash", "hang"}
    assert not session.scalars(select(Action)).all()  # and no restart proposed
    assert runs(client, DEMO_JOB)[0]["state"] == "finished"
    # The trace's straggler (worker 6) is still found in the run's data, and proposes
    # nothing: nobody is left to act on. Whatever is open after a sweep ended with the run.
    found = detect_job(session=session, job_id=job_id(session, DEMO_JOB), width=300)
    follow_up(session=session, changes=found, settings=settings)
    session.commit()
    assert [(i.kind, i.ranks) for i in found.opened] == [("straggler", [6])]
    assert not session.scalars(select(Action)).all()
    sweep(session, settings, DEMO_JOB)
    assert not session.scalars(select(Incident).where(Incident.status == "open")).all()


def test_ranks_falling_silent_together_after_others_left_cleanly_is_no_crash(
    client, session, settings
):
    """The run is finishing: two ranks said goodbye, the other two stopped at the same
    time without one (a goodbye lost at exit)."""
    now = time.time() - 30
    for rank in range(4):
        events = [step(n, ts=now - 20 + n) for n in range(20)]
        last = beat(now, exiting=True, exit_code=0) if rank < 2 else beat(now, step=20)
        send(client, [*events, last], rank=rank, world_size=4, run="launch-a")
    changes = sweep(session, settings)
    assert [i.kind for i in changes.opened] == []


def test_a_run_that_ends_resolves_its_incidents_and_expires_its_actions(client, session, settings):
    launch(client, "launch-a", steps=20, goodbye=False)
    jid = job_id(session)
    straggler, hang = (
        Incident(job_id=jid, kind=kind, fingerprint=f"{jid}:{kind}", ranks=[1], summary=kind)
        for kind in ("straggler", "hang")
    )
    session.add_all([straggler, hang])
    session.flush()
    proposed = propose_restart(session, jid, straggler.id)
    for rank in (0, 1):
        send(client, [beat(exiting=True)], rank=rank, world_size=2, run="launch-a")
    changes = sweep(session, settings)
    assert {i.id for i in changes.resolved} == {straggler.id, hang.id}
    session.expire_all()
    assert straggler.status == "resolved"
    assert straggler.evidence["resolved_because"].startswith("ended with the run (run #1 finished")
    assert straggler.evidence["ended_with_run"] == {"run": 1, "state": "finished"}
    assert hang.evidence["resolved_because"].startswith("the run finished cleanly")
    action = session.get(Action, proposed.id)
    assert action.state == "expired"
    assert action.result["expired_because"].startswith("no process is left to run it: run #1")
    # The page shows why, and offers no Approve.
    page = client.get(f"/jobs/{JOB}", headers=ADMIN).text
    assert "no process is left to run it" in page
    assert f'data-action="approve" data-id="{proposed.id}"' not in page


def test_a_crash_whose_launcher_is_gone_cannot_be_approved_and_its_restart_expires(
    client, session, settings
):
    """Every rank stopped at once without a goodbye: a crash, a restart proposed. Nobody is
    left to receive it: approving is refused (409, saying why); once the run is over
    (``RELAUNCH_QUIET_S`` of silence) the proposal expires with the reason."""
    launch(client, "launch-a", steps=20, goodbye=False)
    age_the_ranks(session, 20)
    silent_since = time.time() - 20
    session.execute(update(Rank).values(last_heartbeat_ts=silent_since, last_step_ts=silent_since))
    session.commit()
    changes = sweep(session, settings)
    assert [i.kind for i in changes.opened] == ["crash"]
    [action] = session.scalars(select(Action)).all()
    assert action.state == "proposed"
    refused = client.post(f"/api/v1/jobs/{JOB}/actions/{action.id}/approve", headers=ADMIN)
    assert refused.status_code == 409, refused.text
    assert refused.json()["error"] == "run_not_live"
    assert "has no live rank" in refused.json()["detail"]
    age_the_ranks(session, RELAUNCH_QUIET_S + 1)
    sweep(session, settings)
    session.expire_all()
    assert session.get(Action, action.id).state == "expired"
    assert runs(client)[0]["state"] == "lost"


def test_an_approved_restart_expires_when_its_run_ends(client, session, settings):
    """Approved while a rank still reported, then the launcher was gone: the restart must
    not stay ``pending`` forever."""
    launch(client, "launch-a", steps=20, goodbye=False)
    action = client.post(
        f"/api/v1/jobs/{JOB}/actions", json={"kind": "restart"}, headers=ADMIN
    ).json()
    assert action["state"] == "pending"
    age_the_ranks(session, RELAUNCH_QUIET_S + 1)
    sweep(session, settings)
    after = client.get(f"/api/v1/actions/{action['id']}", headers=ADMIN).json()
    assert after["state"] == "expired"
    assert "run #1 lost" in after["result"]["expired_because"]


def test_acting_on_a_run_that_ended_is_refused_with_409(client, session, settings):
    launch(client, "launch-a", steps=20)
    sweep(session, settings)
    reply = client.post(f"/api/v1/jobs/{JOB}/actions", json={"kind": "dump_stacks"}, headers=ADMIN)
    assert reply.status_code == 409
    assert "run #1 of job 'llama-8b-pretrain' finished" in reply.json()["detail"]
    assert not session.scalars(select(Action)).all()  # nothing half-made


def test_an_action_made_for_an_earlier_run_is_not_approved_in_the_next(client, session):
    launch(client, "launch-a", steps=20)
    jid = job_id(session)
    old = propose_restart(session, jid)
    launch(client, "launch-b", steps=5, goodbye=False)  # a new run takes over at once
    reply = client.post(f"/api/v1/jobs/{JOB}/actions/{old.id}/approve", headers=ADMIN)
    assert reply.status_code == 409
    assert "made for an earlier run" in reply.json()["detail"]


def test_a_proposal_for_a_resolved_straggler_expires(client, session, settings):
    launch(client, "launch-a", steps=20, goodbye=False)
    jid = job_id(session)
    finding = slow_rank_1()
    opened = apply_findings(
        session=session, job_id=jid, findings=[finding], covered_kinds=["straggler"]
    )
    follow_up(session=session, changes=opened, settings=settings)
    [incident] = opened.opened
    action = propose_restart(session, jid, incident.id)
    page = client.get(f"/jobs/{JOB}", headers=ADMIN).text
    assert f'data-action="approve" data-id="{action.id}"' in page
    cleared = apply_findings(session=session, job_id=jid, findings=[], covered_kinds=["straggler"])
    follow_up(session=session, changes=cleared, settings=settings)
    session.commit()
    session.expire_all()
    assert action.state == "expired"
    assert "resolved before anyone approved" in action.result["expired_because"]
    page = client.get(f"/jobs/{JOB}", headers=ADMIN).text
    assert f'data-action="approve" data-id="{action.id}"' not in page


def test_an_incident_of_the_next_run_does_not_continue_the_last_runs(client, session, settings):
    """Steps start over in a new run: a straggler at step 5 there is a new incident, not
    the re-opened one of the run before."""
    launch(client, "launch-a", steps=20)
    jid = job_id(session)
    finding = slow_rank_1()
    first = apply_findings(session=session, job_id=jid, findings=[finding], covered_kinds=[])
    session.commit()
    sweep(session, settings)  # run 1 finished: its straggler ended with it
    launch(client, "launch-b", steps=20, goodbye=False)
    second = apply_findings(session=session, job_id=jid, findings=[finding], covered_kinds=[])
    [old], [new] = first.opened, second.opened  # a new incident, not an update of the old
    assert new.id != old.id and second.reopened == []
    assert new.status == "open" and old.status == "resolved"


def test_what_detection_opens_in_an_ended_runs_last_data_ends_with_it(client, session, settings):
    launch(client, "launch-a", steps=20)
    sweep(session, settings)  # finished
    jid = job_id(session)
    late = apply_findings(
        session=session, job_id=jid, findings=[slow_rank_1()], covered_kinds=["straggler"]
    )
    follow_up(session=session, changes=late, settings=settings)
    session.commit()
    assert [i.kind for i in late.opened] == ["straggler"]
    assert not session.scalars(select(Action)).all()  # nobody is left to act on
    [resolved] = sweep(session, settings).resolved
    assert resolved.evidence["resolved_because"].startswith("ended with the run (run #1 finished")


def test_a_run_silent_for_hours_is_still_swept_and_ended(client, session, settings):
    """The sweep looks at recently seen jobs, and at every job whose run has not ended
    (a server that was down for hours must still end the runs it followed)."""
    launch(client, "launch-a", steps=5, goodbye=False)
    age_the_ranks(session, 3 * 3600)
    assert job_id(session) in active_jobs(session=session)
    sweep(session, settings)
    assert runs(client)[0]["state"] == "lost"
    assert job_id(session) not in active_jobs(session=session)
